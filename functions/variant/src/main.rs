//! The variant handler as an AWS Lambda function: a PackageVariant's
//! downstream kept in step with its upstream (packagevariants spec §2).
//! Configuration and error types: `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::Variant).await
}
