//! The sync handler as an AWS Lambda function: repository discovery into objects to apply and delete (spec §6).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Sync).await
}
