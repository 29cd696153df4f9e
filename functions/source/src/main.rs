//! The source handler as an AWS Lambda function: init, clone, copy and upgrade as a new draft (spec §3).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Source).await
}
