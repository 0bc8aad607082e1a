//! Remote object stores for Sluice (issue 15): object URLs, and ranged reads of objects
//! into caller buffers, many GETs in flight, with retries, typed errors and ETag pinning.
//!
//! The object stores come through the Apache Arrow `object_store` crate (S3-compatible
//! endpoints, GCS, Azure), with credentials from the standard environment and config
//! chains; nothing here speaks HTTP or signs requests. The reads are synchronous calls
//! that run on a small tokio runtime of this crate's own, so callers (the Python bindings
//! with the GIL released, the mount) stay synchronous; the loader's object engine spawns
//! [`RemoteStore::read_into`] futures on that runtime instead (docs/design/remote.md).

mod error;
#[cfg(any(test, feature = "testing"))]
mod faulty;
mod store;
mod url;

pub use error::RemoteError;
#[cfg(any(test, feature = "testing"))]
pub use faulty::{Fault, FaultyStore, ListFault};
pub use store::{
    runtime_handle, Listed, ObjectInfo, ReadReport, RemoteOptions, RemoteStore, MULTIPART_BYTES,
};
pub use url::{ObjectUrl, Scheme};
