//! [`FaultyStore`]: an `ObjectStore` that passes calls to another and injects scheduled
//! faults into its GETs (failures, short or overlong bodies, a changed object), the test
//! double for remote reads.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What the next GET does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Passes through.
    None,
    /// Fails with a generic store error.
    Fail,
    /// Returns this many bytes fewer than asked (the body ends early).
    Short(usize),
    /// Returns one byte more than asked.
    Long,
    /// Fails as a changed object does under `If-Match`.
    Changed,
}

/// How listings fail, as a real store's list requests do: object_store leaves them
/// `Generic`, while a HEAD's error is typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListFault {
    /// Listings pass through.
    None,
    /// Listings fail `Generic`; HEADs find nothing (a missing bucket).
    MissingBucket,
    /// Listings fail `Generic`; HEADs are refused (bad credentials).
    Refused,
}

/// Wraps a store; each ranged GET takes the next scheduled fault (none once they run
/// out). HEADs pass through, unless listings are set to fail ([`FaultyStore::lists`]).
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<VecDeque<Fault>>,
    gets: Mutex<usize>,
    lists: ListFault,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>, faults: Vec<Fault>) -> FaultyStore {
        FaultyStore {
            inner,
            faults: Mutex::new(faults.into()),
            gets: Mutex::new(0),
            lists: ListFault::None,
        }
    }

    /// The same store, its listings (and HEADs) failing as `fault` says.
    pub fn lists(mut self, fault: ListFault) -> FaultyStore {
        self.lists = fault;
        self
    }

    /// A listing's error, if listings fail.
    fn list_fault(&self) -> Option<object_store::Error> {
        (self.lists != ListFault::None).then(|| object_store::Error::Generic {
            store: "faulty",
            source: injected("list request failed (the status is in no public type)"),
        })
    }

    /// GETs served so far, faulty ones included.
    pub fn gets(&self) -> usize {
        *self.gets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_fault(&self) -> Fault {
        *self.gets.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
            .unwrap_or(Fault::None)
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn injected(what: &str) -> Box<dyn std::error::Error + Send + Sync> {
    format!("injected fault: {what}").into()
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if options.head {
            // HEADs (`info`) pass uncounted: the GET faults are for reads.
            return match self.lists {
                ListFault::None => self.inner.get_opts(location, options).await,
                ListFault::MissingBucket => Err(object_store::Error::NotFound {
                    path: location.to_string(),
                    source: injected("no such bucket"),
                }),
                ListFault::Refused => Err(object_store::Error::PermissionDenied {
                    path: location.to_string(),
                    source: injected("403"),
                }),
            };
        }
        let fault = self.next_fault();
        match fault {
            Fault::None => return self.inner.get_opts(location, options).await,
            Fault::Fail => {
                return Err(object_store::Error::Generic {
                    store: "faulty",
                    source: injected("GET failed"),
                })
            }
            Fault::Changed => {
                return Err(object_store::Error::Precondition {
                    path: location.to_string(),
                    source: injected("ETag changed"),
                })
            }
            Fault::Short(_) | Fault::Long => {}
        }
        let got = self.inner.get_opts(location, options).await?;
        let (meta, range, attributes) =
            (got.meta.clone(), got.range.clone(), got.attributes.clone());
        let body: Vec<Bytes> = got.into_stream().try_collect().await?;
        let mut bytes: Vec<u8> = body.concat();
        match fault {
            Fault::Short(n) => bytes.truncate(bytes.len().saturating_sub(n)),
            _ => bytes.push(0),
        }
        let stream = futures::stream::once(async move { Ok(Bytes::from(bytes)) }).boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream),
            meta,
            range,
            attributes,
        })
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        match self.list_fault() {
            Some(e) => futures::stream::once(async move { Err(e) }).boxed(),
            None => self.inner.list(prefix),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        match self.list_fault() {
            Some(e) => Err(e),
            None => self.inner.list_with_delimiter(prefix).await,
        }
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}
