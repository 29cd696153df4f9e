//! Any operation's Lambda function, chosen by `PORCH_OPERATION` (the
//! per-operation crates fix it instead).

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let name = std::env::var("PORCH_OPERATION").unwrap_or_default();
    let operation = porch_lambda::operation(&name)?;
    porch_lambda::main(operation).await
}
