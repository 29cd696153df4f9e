//! The variant-set handler as an AWS Lambda function: a
//! PackageVariantSet's PackageVariants generated from its targets and
//! templates (packagevariants spec §3). Configuration and error types:
//! `porch_lambda`.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    porch_lambda::main(porch_api::invocation::Operation::VariantSet).await
}
