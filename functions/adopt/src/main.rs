//! The adopt handler as an AWS Lambda function: the finalizer and the Repository owner reference (spec §4.7).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Adopt).await
}
