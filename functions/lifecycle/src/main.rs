//! The lifecycle handler as an AWS Lambda function: propose, reject, publish and deletion proposals (spec §4).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Lifecycle).await
}
