//! [`RemoteError`]: every failure names the object URL, and the byte range where a read
//! failed; a read never returns fewer or other bytes than asked as a success.

use std::ops::Range;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{url:?}: not an object URL: {why}")]
    BadUrl { url: String, why: String },
    #[error("{url}: cannot configure the store: {why}")]
    Config { url: String, why: String },
    /// No such object, or (`what` says which) no such bucket or container.
    #[error("{url}: no such {what}")]
    NotFound { url: String, what: &'static str },
    #[error("{url}: the object changed while it was read (ETag was {expected:?})")]
    Changed { url: String, expected: String },
    #[error("{url}: bytes {}..{}: got {got} bytes", range.start, range.end)]
    Short {
        url: String,
        range: Range<u64>,
        got: u64,
    },
    #[error("{url}: bytes {}..{}: {source}", range.start, range.end)]
    Read {
        url: String,
        range: Range<u64>,
        #[source]
        source: object_store::Error,
    },
    #[error("{url}: {source}")]
    Request {
        url: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{url}: bytes {}..{} lie beyond the object's {size} bytes", range.start, range.end)]
    OutOfRange {
        url: String,
        range: Range<u64>,
        size: u64,
    },
    #[error("cannot start the remote I/O runtime: {0}")]
    Runtime(std::io::Error),
}

impl RemoteError {
    /// True for a bad URL or store setting: the caller's input, not the store, is at fault.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            RemoteError::BadUrl { .. } | RemoteError::Config { .. }
        )
    }

    /// The error as an `io::Error` of the matching kind (not found, permission denied,
    /// other), for I/O traits; the `RemoteError` stays inside for whoever downcasts it.
    pub fn into_io(self) -> std::io::Error {
        let kind = match &self {
            RemoteError::NotFound { .. } => std::io::ErrorKind::NotFound,
            _ if self.is_permission_denied() => std::io::ErrorKind::PermissionDenied,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, self)
    }

    /// True when the store refused the credentials or the access (HTTP 401/403).
    pub fn is_permission_denied(&self) -> bool {
        match self {
            RemoteError::Read { source, .. } | RemoteError::Request { source, .. } => {
                matches!(
                    source,
                    object_store::Error::PermissionDenied { .. }
                        | object_store::Error::Unauthenticated { .. }
                ) || refused_status(source)
            }
            _ => false,
        }
    }
}

/// Whether a store's generic error is an HTTP 401 or 403. object_store types those for
/// GETs and HEADs, but its Azure and GCS list requests come back `Generic`, with the
/// status only in the message of an error in the chain (its retry error is not public).
fn refused_status(e: &object_store::Error) -> bool {
    if !matches!(e, object_store::Error::Generic { .. }) {
        return false;
    }
    let mut at: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = at {
        let text = err.to_string();
        if text.contains("403 Forbidden") || text.contains("401 Unauthorized") {
            return true;
        }
        at = err.source();
    }
    false
}

/// Whether a store's generic error says the bucket or container does not exist (a list
/// request, which object_store leaves `Generic`, with the code only in the message).
pub(crate) fn missing_bucket(e: &object_store::Error) -> bool {
    if !matches!(e, object_store::Error::Generic { .. }) {
        return false;
    }
    let mut at: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = at {
        let text = err.to_string();
        if ["NoSuchBucket", "ContainerNotFound", "404 Not Found"]
            .iter()
            .any(|code| text.contains(code))
        {
            return true;
        }
        at = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(msg: &str) -> RemoteError {
        RemoteError::Request {
            url: "az://c/k".into(),
            source: object_store::Error::Generic {
                store: "MicrosoftAzure",
                source: Box::new(std::io::Error::other(msg.to_string())),
            },
        }
    }

    #[test]
    fn a_generic_401_or_403_is_permission_denied_and_nothing_else_is() {
        let denied = "Error performing list request: Server returned non-2xx status code: 403 Forbidden: <Error>";
        assert!(generic(denied).is_permission_denied());
        assert!(generic("status code: 401 Unauthorized").is_permission_denied());
        assert!(!generic("status code: 500 Internal Server Error").is_permission_denied());
        let e = generic(denied).into_io();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    }
}
