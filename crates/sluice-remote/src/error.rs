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
    /// The store refused the credentials or the access (HTTP 401 or 403).
    #[error("{url}: access refused: {source}")]
    Refused {
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
    /// A local file an upload reads from could not be read.
    #[error("{}: {source}", path.display())]
    Local {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
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

    /// True when the store refused the credentials or the access (HTTP 401/403), as
    /// object_store types it (or as a listing's HEAD probe found it: `Refused`).
    pub fn is_permission_denied(&self) -> bool {
        match self {
            RemoteError::Refused { .. } => true,
            RemoteError::Read { source, .. } | RemoteError::Request { source, .. } => matches!(
                source,
                object_store::Error::PermissionDenied { .. }
                    | object_store::Error::Unauthenticated { .. }
            ),
            _ => false,
        }
    }
}

impl sluice_engine::Classify for RemoteError {
    fn class(&self) -> sluice_engine::ErrorClass {
        use sluice_engine::ErrorClass;
        match self {
            _ if self.is_config() => ErrorClass::Config,
            RemoteError::NotFound { .. } => ErrorClass::NotFound,
            _ if self.is_permission_denied() => ErrorClass::PermissionDenied,
            _ => ErrorClass::Io,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_permission_denied_by_their_type_not_their_text() {
        let typed = RemoteError::Request {
            url: "s3://b/k".into(),
            source: object_store::Error::PermissionDenied {
                path: "k".into(),
                source: "denied".into(),
            },
        };
        assert!(typed.is_permission_denied());
        assert_eq!(typed.into_io().kind(), std::io::ErrorKind::PermissionDenied);
        // A generic error that says 403 in its text is not classified by that text.
        let generic = RemoteError::Request {
            url: "az://c/k".into(),
            source: object_store::Error::Generic {
                store: "MicrosoftAzure",
                source: Box::new(std::io::Error::other("status code: 403 Forbidden")),
            },
        };
        assert!(!generic.is_permission_denied());
    }
}
