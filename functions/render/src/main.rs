//! The render handler as an AWS Lambda function: rendering a draft (spec §5).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Render).await
}
