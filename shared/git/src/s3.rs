//! The S3 object store: any S3-compatible endpoint, with the conditional
//! writes the snapshot relies on (`If-None-Match: *` to create,
//! `If-Match: <etag>` to replace) and conditional reads
//! (`If-None-Match: <etag>`, answered `304` when nothing changed).

use crate::store::{
    ETag, Fetched, ObjectStore, PutCondition, StoreError, StoredObject, validate_key,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use std::time::Duration;

/// Where and how to reach the bucket.
#[derive(Debug, Clone)]
pub struct S3Options {
    pub bucket: String,
    /// Prepended to every key, e.g. `porch/` (empty for none).
    pub prefix: String,
    /// An S3-compatible endpoint instead of AWS (MinIO, moto, Ceph).
    pub endpoint: Option<String>,
    /// Else the region of the environment (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// `https://endpoint/bucket/key` instead of `https://bucket.endpoint/key`.
    pub force_path_style: bool,
    /// Attempts per request by the SDK (its standard retry on throttling,
    /// 5xx and broken connections); 1 turns retries off.
    pub max_attempts: u32,
    /// For one request including its retries.
    pub operation_timeout: Duration,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            bucket: String::new(),
            prefix: String::new(),
            endpoint: None,
            region: None,
            force_path_style: false,
            max_attempts: 3,
            operation_timeout: Duration::from_secs(30),
        }
    }
}

/// Objects in an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

impl S3Store {
    /// A store with credentials and region from the environment (the
    /// Lambda role, `AWS_*` variables, the profile) and `options`.
    ///
    /// # Errors
    /// An invalid prefix.
    pub async fn connect(options: S3Options) -> Result<Self, StoreError> {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = &options.region {
            loader = loader.region(aws_config::Region::new(region.clone()));
        }
        let shared = loader.load().await;
        let config = Self::config(aws_sdk_s3::config::Builder::from(&shared), &options);
        Self::with_client(
            aws_sdk_s3::Client::from_conf(config),
            &options.bucket,
            &options.prefix,
        )
    }

    /// The client settings `options` ask for, on top of `builder`.
    pub fn config(builder: aws_sdk_s3::config::Builder, options: &S3Options) -> aws_sdk_s3::Config {
        let mut builder = builder
            .force_path_style(options.force_path_style)
            .retry_config(
                aws_sdk_s3::config::retry::RetryConfig::standard()
                    .with_max_attempts(options.max_attempts.max(1)),
            )
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .operation_timeout(options.operation_timeout)
                    .build(),
            );
        if let Some(endpoint) = &options.endpoint {
            builder = builder.endpoint_url(endpoint);
        }
        if let Some(region) = &options.region {
            builder = builder.region(aws_sdk_s3::config::Region::new(region.clone()));
        }
        builder.build()
    }

    /// A store on an existing client.
    ///
    /// # Errors
    /// An empty bucket name or an invalid prefix.
    pub fn with_client(
        client: aws_sdk_s3::Client,
        bucket: &str,
        prefix: &str,
    ) -> Result<Self, StoreError> {
        if bucket.is_empty() {
            return Err(StoreError::InvalidKey {
                key: String::new(),
                reason: "the bucket name is empty",
            });
        }
        if !prefix.is_empty() {
            validate_key(prefix.trim_end_matches('/'))?;
        }
        let prefix = match prefix {
            "" => String::new(),
            p if p.ends_with('/') => p.to_owned(),
            p => format!("{p}/"),
        };
        Ok(Self {
            client,
            bucket: bucket.to_owned(),
            prefix,
        })
    }

    fn full_key(&self, key: &str) -> Result<String, StoreError> {
        validate_key(key)?;
        Ok(format!("{}{key}", self.prefix))
    }
}

/// Maps an SDK error: 412 and 409 (a concurrent conditional write) are a
/// failed precondition, 404 not found, 5xx/throttling/timeouts transient.
fn map_error<E: ProvideErrorMetadata + std::error::Error + 'static>(
    step: &'static str,
    key: &str,
    err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> StoreError {
    let status = err.raw_response().map(|r| r.status().as_u16());
    match status {
        Some(412 | 409) => {
            return StoreError::PreconditionFailed {
                key: key.to_owned(),
            };
        }
        Some(404) => {
            return StoreError::NotFound {
                key: key.to_owned(),
            };
        }
        _ => {}
    }
    let transient = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(_) => {
            status.is_some_and(|s| s >= 500 || s == 429 || s == 408)
                || matches!(
                    err.code(),
                    Some("SlowDown" | "RequestTimeout" | "InternalError")
                )
        }
        _ => false,
    };
    let message = match (err.code(), err.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        _ => {
            let mut text = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(inner) = source {
                text.push_str(": ");
                text.push_str(&inner.to_string());
                source = inner.source();
            }
            text
        }
    };
    StoreError::Unavailable {
        step,
        key: key.to_owned(),
        message: match status {
            Some(s) => format!("HTTP {s}: {message}"),
            None => message,
        },
        transient,
    }
}

impl S3Store {
    async fn get_inner(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        let full = self.full_key(key)?;
        let mut request = self.client.get_object().bucket(&self.bucket).key(&full);
        if let Some(tag) = known {
            request = request.if_none_match(&tag.0);
        }
        let output = match request.send().await {
            Ok(output) => output,
            Err(err) => {
                let status = err.raw_response().map(|r| r.status().as_u16());
                if status == Some(304) {
                    return Ok(Fetched::NotModified);
                }
                if err.as_service_error().is_some_and(|e| e.is_no_such_key()) || status == Some(404)
                {
                    return Ok(Fetched::Missing);
                }
                return Err(map_error("read", key, err));
            }
        };
        let etag = ETag(output.e_tag().unwrap_or_default().to_owned());
        let expected = output.content_length();
        let body = output
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Unavailable {
                step: "read",
                key: key.to_owned(),
                message: e.to_string(),
                transient: true,
            })?
            .into_bytes()
            .to_vec();
        if let Some(expected) = expected
            && u64::try_from(body.len()).ok() != u64::try_from(expected).ok()
        {
            return Err(StoreError::Unavailable {
                step: "read",
                key: key.to_owned(),
                message: format!("truncated body: {} of {expected} bytes", body.len()),
                transient: true,
            });
        }
        Ok(Fetched::Found(StoredObject { body, etag }))
    }
}

impl ObjectStore for S3Store {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        match self.get_inner(key, None).await? {
            Fetched::Found(object) => Ok(Some(object)),
            Fetched::Missing | Fetched::NotModified => Ok(None),
        }
    }

    async fn get_if_changed(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        self.get_inner(key, known).await
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> Result<ETag, StoreError> {
        let full = self.full_key(key)?;
        let mut request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(&full)
            .body(ByteStream::from(body));
        request = match &condition {
            PutCondition::Always => request,
            PutCondition::IfAbsent => request.if_none_match("*"),
            PutCondition::IfMatch(tag) => request.if_match(&tag.0),
        };
        let output = request
            .send()
            .await
            .map_err(|e| map_error("write", key, e))?;
        Ok(ETag(output.e_tag().unwrap_or_default().to_owned()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let full_prefix = format!("{}{prefix}", self.prefix);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let output = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_continuation_token(token)
                .send()
                .await
                .map_err(|e| map_error("list", prefix, e))?;
            for object in output.contents() {
                if let Some(key) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    keys.push(key.to_owned());
                }
            }
            token = output.next_continuation_token().map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        keys.sort();
        Ok(keys)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full_key(key)?;
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
            .map_err(|e| map_error("delete", key, e))?;
        Ok(())
    }
}

/// The object store a deployment chose: the local directory (the embedded
/// default) or an S3 bucket.
#[derive(Debug, Clone)]
pub enum AnyStore {
    Local(crate::store::LocalDirStore),
    S3(S3Store),
}

impl ObjectStore for AnyStore {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        match self {
            AnyStore::Local(s) => s.get(key).await,
            AnyStore::S3(s) => s.get(key).await,
        }
    }

    async fn get_if_changed(&self, key: &str, known: Option<&ETag>) -> Result<Fetched, StoreError> {
        match self {
            AnyStore::Local(s) => s.get_if_changed(key, known).await,
            AnyStore::S3(s) => s.get_if_changed(key, known).await,
        }
    }

    async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: PutCondition,
    ) -> Result<ETag, StoreError> {
        match self {
            AnyStore::Local(s) => s.put(key, body, condition).await,
            AnyStore::S3(s) => s.put(key, body, condition).await,
        }
    }

    async fn create(&self, key: &str, body: Vec<u8>) -> Result<bool, StoreError> {
        match self {
            AnyStore::Local(s) => s.create(key, body).await,
            AnyStore::S3(s) => s.create(key, body).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        match self {
            AnyStore::Local(s) => s.list(prefix).await,
            AnyStore::S3(s) => s.list(prefix).await,
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self {
            AnyStore::Local(s) => s.delete(key).await,
            AnyStore::S3(s) => s.delete(key).await,
        }
    }
}
