//! [`RemoteStore`]: one bucket of an object store, and ranged reads of its objects into
//! caller buffers.

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use object_store::path::Path as ObjPath;
use object_store::{ClientConfigKey, GetOptions, GetRange, ObjectStore, RetryConfig};
use tokio::runtime::Runtime;

use crate::error::RemoteError;
use crate::url::{ObjectUrl, Scheme};

mod write;
pub use write::{Listed, MULTIPART_BYTES};

/// How a store is reached and read.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// An S3-compatible endpoint (MinIO, Ceph, ...); else `AWS_ENDPOINT_URL`, else AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Virtual-host style (`bucket.host/key`); path style (`host/bucket/key`) otherwise.
    /// `None` leaves the library's choice (and `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`).
    pub virtual_hosted: Option<bool>,
    /// Plain-HTTP endpoints (a local test server); `AWS_ALLOW_HTTP=true` does it too.
    pub allow_http: bool,
    /// Retries of a failed request, and of a body that broke off or came short.
    pub retries: usize,
    /// Per-request timeout.
    pub timeout: Duration,
    /// GETs in flight at once.
    pub concurrency: usize,
    /// Largest GET: a longer range becomes several GETs in flight together.
    pub piece_bytes: u64,
    /// S3 uploads sign their headers only, not a SHA-256 of the body (`UNSIGNED-PAYLOAD`),
    /// for callers that verify every byte themselves; `None` leaves the library's choice
    /// (signed) and `AWS_UNSIGNED_PAYLOAD`.
    pub unsigned_payload: Option<bool>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            endpoint: None,
            region: None,
            virtual_hosted: None,
            allow_http: false,
            retries: 3,
            timeout: Duration::from_secs(30),
            concurrency: 16,
            piece_bytes: 8 << 20,
            unsigned_payload: None,
        }
    }
}

impl RemoteOptions {
    /// The defaults, with what the environment overrides (endpoint, region and addressing
    /// come from the store's own `AWS_*` variables, read when the store is opened):
    /// - `SLUICE_REMOTE_CONCURRENCY`: GETs in flight per read call;
    /// - `SLUICE_REMOTE_PIECE_BYTES`: the largest single GET;
    /// - `SLUICE_REMOTE_RETRIES`: retries of a failed GET;
    /// - `SLUICE_REMOTE_TIMEOUT_S`: per-request timeout in seconds.
    pub fn from_env() -> Result<RemoteOptions, RemoteError> {
        let mut opts = RemoteOptions::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let bad = |name: &str, value: &str, why: &str| RemoteError::Config {
            url: format!("${name}"),
            why: format!("{value:?}: {why}"),
        };
        let int = |name: &str, lo: u64, hi: u64| -> Result<Option<u64>, RemoteError> {
            let Some(v) = var(name) else { return Ok(None) };
            match v.trim().parse::<u64>() {
                Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
                _ => Err(bad(
                    name,
                    &v,
                    &format!("expected a whole number in {lo}..={hi}"),
                )),
            }
        };
        if let Some(n) = int("SLUICE_REMOTE_CONCURRENCY", 1, 1024)? {
            opts.concurrency = n as usize;
        }
        if let Some(n) = int("SLUICE_REMOTE_PIECE_BYTES", 64 << 10, 1 << 30)? {
            opts.piece_bytes = n;
        }
        if let Some(n) = int("SLUICE_REMOTE_RETRIES", 0, 100)? {
            opts.retries = n as usize;
        }
        if let Some(v) = var("SLUICE_REMOTE_TIMEOUT_S") {
            match v.trim().parse::<f64>() {
                Ok(s) if s > 0.0 && s <= 3600.0 => opts.timeout = Duration::from_secs_f64(s),
                _ => {
                    return Err(bad(
                        "SLUICE_REMOTE_TIMEOUT_S",
                        &v,
                        "expected seconds in (0, 3600]",
                    ))
                }
            }
        }
        Ok(opts)
    }
}

impl RemoteOptions {
    /// [`RemoteOptions::from_env`] for a caller that verifies every byte it reads back
    /// itself (a checksum per chunk or record): S3 uploads then sign their headers only,
    /// not a SHA-256 of each body (a CPU cost that buys such a caller nothing), unless
    /// `AWS_UNSIGNED_PAYLOAD` is set, which the store then follows.
    pub fn from_env_self_verified() -> Result<RemoteOptions, RemoteError> {
        let mut opts = RemoteOptions::from_env()?;
        if std::env::var_os("AWS_UNSIGNED_PAYLOAD").is_none() {
            opts.unsigned_payload = Some(true);
        }
        Ok(opts)
    }
}

/// An object's size and version, from one HEAD (or a listing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub url: ObjectUrl,
    pub size: u64,
    /// Every read of the object is pinned to this version (`If-Match`).
    pub etag: Option<String>,
}

/// What a read did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// GETs that returned the bytes asked for (retries not counted).
    pub requests: usize,
    /// Attempts that failed and were retried.
    pub retried: usize,
    pub bytes: u64,
}

/// One bucket (or container) of an object store.
pub struct RemoteStore {
    bucket: ObjectUrl,
    store: Arc<dyn ObjectStore>,
    opts: RemoteOptions,
}

/// The shared runtime remote reads run on (two workers), for callers that spawn reads of
/// their own ([`RemoteStore::read_into`]).
pub fn runtime_handle() -> Result<tokio::runtime::Handle, RemoteError> {
    Ok(runtime()?.handle().clone())
}

fn runtime() -> Result<&'static Runtime, RemoteError> {
    static RT: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-remote")
        .enable_all()
        .build()
        .map_err(RemoteError::Runtime)?;
    Ok(RT.get_or_init(|| rt))
}

impl RemoteStore {
    /// The bucket of `url`, configured from `opts` and the environment's credential and
    /// config chains (`AWS_*`, `GOOGLE_*`, `AZURE_*`).
    pub fn open(url: &ObjectUrl, opts: &RemoteOptions) -> Result<RemoteStore, RemoteError> {
        let retry = RetryConfig {
            max_retries: opts.retries,
            retry_timeout: opts.timeout * (opts.retries as u32 + 1),
            ..RetryConfig::default()
        };
        // Client settings go in as config keys on top of what `from_env` read (AWS_ALLOW_HTTP,
        // proxies, ...), not as a replacement `ClientOptions` that would drop those.
        let mut client = vec![(
            ClientConfigKey::Timeout,
            format!("{}ms", opts.timeout.as_millis()),
        )];
        if opts.allow_http {
            client.push((ClientConfigKey::AllowHttp, "true".to_string()));
        }
        let config = |e: object_store::Error| RemoteError::Config {
            url: url.to_string(),
            why: e.to_string(),
        };
        let store: Arc<dyn ObjectStore> = match url.scheme {
            Scheme::S3 => {
                check_s3_settings(opts)?;
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(&url.bucket)
                    .with_retry(retry);
                for (k, v) in client {
                    b = b.with_config(AmazonS3ConfigKey::Client(k), v);
                }
                if let Some(e) = &opts.endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(r) = &opts.region {
                    b = b.with_region(r);
                }
                if let Some(v) = opts.virtual_hosted {
                    b = b.with_virtual_hosted_style_request(v);
                }
                if let Some(v) = opts.unsigned_payload {
                    b = b.with_unsigned_payload(v);
                }
                Arc::new(b.build().map_err(config)?)
            }
            Scheme::Gcs => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&url.bucket)
                    .with_retry(retry);
                for (k, v) in client {
                    b = b.with_config(GoogleConfigKey::Client(k), v);
                }
                Arc::new(b.build().map_err(config)?)
            }
            Scheme::Azure => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(&url.bucket)
                    .with_retry(retry);
                for (k, v) in client {
                    b = b.with_config(AzureConfigKey::Client(k), v);
                }
                Arc::new(b.build().map_err(config)?)
            }
        };
        Ok(RemoteStore::with_store(url, store, opts))
    }

    /// A store over any `ObjectStore` (an in-memory one, a fault-injecting double).
    pub fn with_store(
        url: &ObjectUrl,
        store: Arc<dyn ObjectStore>,
        opts: &RemoteOptions,
    ) -> RemoteStore {
        RemoteStore {
            bucket: ObjectUrl {
                key: String::new(),
                ..url.clone()
            },
            store,
            opts: opts.clone(),
        }
    }

    fn path(&self, url: &ObjectUrl) -> Result<ObjPath, RemoteError> {
        if url.scheme != self.bucket.scheme || url.bucket != self.bucket.bucket {
            return Err(RemoteError::BadUrl {
                url: url.to_string(),
                why: format!("not in {}", self.bucket),
            });
        }
        ObjPath::parse(&url.key).map_err(|e| RemoteError::BadUrl {
            url: url.to_string(),
            why: e.to_string(),
        })
    }

    /// Size and version of one object (a HEAD).
    pub fn info(&self, url: &ObjectUrl) -> Result<ObjectInfo, RemoteError> {
        let path = self.path(url)?;
        let meta = runtime()?
            .block_on(self.store.head(&path))
            .map_err(|e| request_error(url, e))?;
        Ok(ObjectInfo {
            url: url.clone(),
            size: meta.size,
            etag: meta.e_tag,
        })
    }

    /// The objects under `prefix` (a "directory": `prefix/...`), in key order.
    pub fn list(&self, prefix: &ObjectUrl) -> Result<Vec<ObjectInfo>, RemoteError> {
        let path = self.path(prefix)?;
        let under = (!prefix.key.is_empty()).then_some(&path);
        let listed = runtime()?.block_on(self.store.list(under).try_collect::<Vec<_>>());
        let metas = match listed {
            Ok(metas) => metas,
            Err(e) => return Err(self.list_error(prefix, e)),
        };
        Ok(self.infos(metas))
    }

    /// The objects directly under `prefix` (a "directory": `prefix/name`, not
    /// `prefix/sub/name`), in key order, as a local directory listing gives its files, and
    /// how many deeper prefixes (subdirectories) it holds.
    pub fn list_dir(&self, prefix: &ObjectUrl) -> Result<(Vec<ObjectInfo>, usize), RemoteError> {
        let path = self.path(prefix)?;
        let under = (!prefix.key.is_empty()).then_some(&path);
        let listed = match runtime()?.block_on(self.store.list_with_delimiter(under)) {
            Ok(listed) => listed,
            Err(e) => return Err(self.list_error(prefix, e)),
        };
        Ok((self.infos(listed.objects), listed.common_prefixes.len()))
    }

    /// Why a listing failed. object_store types the errors of GETs and HEADs (not found,
    /// refused) but leaves a failed list request `Generic`, its HTTP status in no public
    /// type. So a generic listing failure is classified by a HEAD under the prefix, whose
    /// error is typed: not found means the bucket (or container) is missing (a prefix with
    /// nothing under it lists empty, it does not fail), refused means the credentials are.
    fn list_error(&self, prefix: &ObjectUrl, e: object_store::Error) -> RemoteError {
        if !matches!(e, object_store::Error::Generic { .. }) {
            return request_error(prefix, e);
        }
        let probe = match prefix.key.is_empty() {
            true => ObjPath::from(".sluice-probe"),
            false => ObjPath::from(format!(
                "{}/.sluice-probe",
                prefix.key.trim_end_matches('/')
            )),
        };
        let head = runtime().map(|rt| rt.block_on(self.store.head(&probe)));
        match head {
            Ok(Err(object_store::Error::NotFound { .. })) => RemoteError::NotFound {
                url: prefix.to_string(),
                what: "bucket",
            },
            Ok(Err(
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. },
            )) => RemoteError::Refused {
                url: prefix.to_string(),
                source: e,
            },
            _ => request_error(prefix, e),
        }
    }

    /// A listing's objects as infos, in key order.
    fn infos(&self, metas: Vec<object_store::ObjectMeta>) -> Vec<ObjectInfo> {
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|m| ObjectInfo {
                url: ObjectUrl {
                    key: m.location.to_string(),
                    ..self.bucket.clone()
                },
                size: m.size,
                etag: m.e_tag,
            })
            .collect();
        out.sort_by(|a, b| a.url.key.cmp(&b.url.key));
        out
    }

    /// Fills each `(offset, buffer)` with the object's bytes at that offset: every range
    /// in pieces of at most `piece_bytes`, `concurrency` GETs in flight, each pinned to the
    /// object's ETag. All or nothing: the first error (after retries) is returned, naming
    /// the object and the range.
    pub fn read_ranges(
        &self,
        obj: &ObjectInfo,
        reads: Vec<(u64, &mut [u8])>,
    ) -> Result<ReadReport, RemoteError> {
        let reads = reads.into_iter().map(|(at, buf)| (at, vec![buf])).collect();
        runtime()?.block_on(self.read_all(obj, reads))
    }

    /// Fills `bufs`, one after the other, with the object's bytes from `offset`: the range
    /// they cover together is cut into pieces of at most `piece_bytes` as
    /// [`RemoteStore::read_ranges`] cuts one buffer, a piece spanning buffers where they
    /// meet (a record's small header and its payload cost one GET, not two).
    pub fn read_vectored(
        &self,
        obj: &ObjectInfo,
        offset: u64,
        bufs: Vec<&mut [u8]>,
    ) -> Result<ReadReport, RemoteError> {
        runtime()?.block_on(self.read_all(obj, vec![(offset, bufs)]))
    }

    /// Fills `dst` with the object's bytes at `offset`, as [`RemoteStore::read_ranges`] does
    /// for one range, but as a future: an engine runs many on the shared runtime instead of
    /// blocking a thread on each.
    pub async fn read_into(
        &self,
        obj: &ObjectInfo,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<ReadReport, RemoteError> {
        self.read_all(obj, vec![(offset, vec![dst])]).await
    }

    /// Each `(offset, buffers)`: the buffers filled one after the other from `offset`, the
    /// range they cover cut into pieces of at most `piece_bytes` from `offset` on (a piece
    /// spans buffers where they meet), `concurrency` pieces in flight. All or nothing.
    async fn read_all(
        &self,
        obj: &ObjectInfo,
        reads: Vec<(u64, Vec<&mut [u8]>)>,
    ) -> Result<ReadReport, RemoteError> {
        let path = self.path(&obj.url)?;
        let piece = self.opts.piece_bytes.max(1);
        // The pieces are cut before the first await: a lazy iterator's closure held across
        // awaits would keep the future from being `Send`.
        let mut pieces: Vec<(Range<u64>, Vec<&mut [u8]>)> = Vec::new();
        for (offset, bufs) in reads {
            let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
            check_range(obj, offset..offset + len)?;
            let mut at = offset;
            for mut buf in bufs {
                while !buf.is_empty() {
                    let into_piece = (at - offset) % piece;
                    let n = (piece - into_piece).min(buf.len() as u64) as usize;
                    let (head, rest) = std::mem::take(&mut buf).split_at_mut(n);
                    match pieces.last_mut() {
                        Some((r, parts)) if into_piece != 0 => {
                            r.end += n as u64;
                            parts.push(head);
                        }
                        _ => pieces.push((at..at + n as u64, vec![head])),
                    }
                    at += n as u64;
                    buf = rest;
                }
            }
        }
        self.fetch_pieces(&path, obj, pieces).await
    }

    /// Fetches every piece, `concurrency` at once: all or nothing.
    async fn fetch_pieces(
        &self,
        path: &ObjPath,
        obj: &ObjectInfo,
        pieces: Vec<(Range<u64>, Vec<&mut [u8]>)>,
    ) -> Result<ReadReport, RemoteError> {
        let bytes: u64 = pieces.iter().map(|(r, _)| r.end - r.start).sum();
        let fetches: Vec<_> = pieces
            .into_iter()
            .map(|(range, mut dst)| async move { self.fetch(path, obj, range, &mut dst).await })
            .collect();
        let retried: Vec<usize> = futures::stream::iter(fetches)
            .buffer_unordered(self.opts.concurrency.max(1))
            .try_collect()
            .await?;
        Ok(ReadReport {
            requests: retried.len(),
            retried: retried.iter().sum(),
            bytes,
        })
    }

    /// One piece, retried when the body breaks off or comes short; the retries it took.
    async fn fetch(
        &self,
        path: &ObjPath,
        obj: &ObjectInfo,
        range: Range<u64>,
        dst: &mut [&mut [u8]],
    ) -> Result<usize, RemoteError> {
        let mut attempt = 0;
        loop {
            match self.fetch_once(path, obj, range.clone(), dst).await {
                Ok(()) => return Ok(attempt),
                Err(e @ (RemoteError::Short { .. } | RemoteError::Read { .. }))
                    if attempt < self.opts.retries =>
                {
                    tracing::debug!("{e}; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn fetch_once(
        &self,
        path: &ObjPath,
        obj: &ObjectInfo,
        range: Range<u64>,
        dst: &mut [&mut [u8]],
    ) -> Result<(), RemoteError> {
        let url = || obj.url.to_string();
        let opts = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: obj.etag.clone(),
            ..GetOptions::default()
        };
        let read_error = |e: object_store::Error| match e {
            object_store::Error::NotFound { .. } => RemoteError::NotFound {
                url: url(),
                what: "object",
            },
            object_store::Error::Precondition { .. } => RemoteError::Changed {
                url: url(),
                expected: obj.etag.clone().unwrap_or_default(),
            },
            e => RemoteError::Read {
                url: url(),
                range: range.clone(),
                source: e,
            },
        };
        let got = self.store.get_opts(path, opts).await.map_err(read_error)?;
        for d in dst.iter_mut() {
            sluice_engine::populate_write(d);
        }
        let want: usize = dst.iter().map(|d| d.len()).sum();
        let mut body = got.into_stream();
        // Where the next byte goes: buffer `part`, offset `at` in it; `total` so far.
        let (mut part, mut at, mut total) = (0usize, 0usize, 0usize);
        while let Some(chunk) = body.next().await {
            let mut chunk: &[u8] = &chunk.map_err(read_error)?;
            if total + chunk.len() > want {
                return Err(RemoteError::Short {
                    url: url(),
                    range: range.clone(),
                    got: (total + chunk.len()) as u64,
                });
            }
            total += chunk.len();
            while !chunk.is_empty() {
                let d = &mut dst[part];
                let n = chunk.len().min(d.len() - at);
                d[at..at + n].copy_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                at += n;
                if at == d.len() {
                    part += 1;
                    at = 0;
                }
            }
        }
        if total != want {
            return Err(RemoteError::Short {
                url: url(),
                range,
                got: total as u64,
            });
        }
        Ok(())
    }
}

/// `range` of `obj`, or an error naming it where it lies past the object's end.
fn check_range(obj: &ObjectInfo, range: Range<u64>) -> Result<(), RemoteError> {
    match range.end > obj.size {
        true => Err(RemoteError::OutOfRange {
            url: obj.url.to_string(),
            range,
            size: obj.size,
        }),
        false => Ok(()),
    }
}

/// The S3 settings the client library would panic on, as configuration errors naming them:
/// an endpoint from `opts` or the environment that is empty, has no scheme or no host, or
/// is plain HTTP without `AWS_ALLOW_HTTP=true`; and a credential, region or endpoint
/// variable with surrounding white space or a control character (a pasted newline), which
/// cannot go into an HTTP header. A secret's value is never shown.
fn check_s3_settings(opts: &RemoteOptions) -> Result<(), RemoteError> {
    for (name, secret) in [
        ("AWS_ENDPOINT_URL", false),
        ("AWS_ENDPOINT", false),
        ("AWS_REGION", false),
        ("AWS_DEFAULT_REGION", false),
        ("AWS_ACCESS_KEY_ID", true),
        ("AWS_SECRET_ACCESS_KEY", true),
        ("AWS_SESSION_TOKEN", true),
    ] {
        let Ok(value) = std::env::var(name) else {
            continue;
        };
        if value.trim() != value || value.chars().any(char::is_control) {
            let shown = match secret {
                true => "its value".to_string(),
                false => format!("{value:?}"),
            };
            return Err(RemoteError::Config {
                url: format!("${name}"),
                why: format!("{shown} has white space around it or a control character"),
            });
        }
    }
    let (name, value) = match &opts.endpoint {
        Some(e) => ("endpoint", e.clone()),
        None => match ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .into_iter()
            .find_map(|v| std::env::var(v).ok().map(|e| (v, e)))
        {
            Some((v, e)) => (v, e),
            None => return Ok(()),
        },
    };
    let shown = match name {
        "endpoint" => name.to_string(),
        _ => format!("${name}"),
    };
    let bad = |why: &str| RemoteError::Config {
        url: shown.clone(),
        why: format!("{value:?}: {why}"),
    };
    let parsed = url::Url::parse(&value).map_err(|e| {
        bad(&format!(
            "not a URL ({e}); expected e.g. http://127.0.0.1:9000"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("expected an http:// or https:// URL with a host"));
    }
    let http_allowed = opts.allow_http
        || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if parsed.scheme() == "http" && !http_allowed {
        return Err(bad(
            "a plain-HTTP endpoint needs AWS_ALLOW_HTTP=true (the client refuses http:// otherwise)",
        ));
    }
    Ok(())
}

fn request_error(url: &ObjectUrl, e: object_store::Error) -> RemoteError {
    match e {
        object_store::Error::NotFound { .. } => RemoteError::NotFound {
            url: url.to_string(),
            what: "object",
        },
        e => RemoteError::Request {
            url: url.to_string(),
            source: e,
        },
    }
}
