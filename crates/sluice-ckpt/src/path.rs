//! Checkpoint paths, checked once for every front (Python, DCP, the CLI).
//!
//! A checkpoint is named `STORE/NAME`: the store is a directory or an object-store prefix
//! (`s3://bucket/run`, `gs://...`, `az://...`), the name one plain file name inside it.
//! The checks here are what keeps a save inside the store the user named:
//! - a path ending in `/`, `/.` or `/..` names no checkpoint (`Path("STORE/").name` is
//!   `STORE`, which would save a checkpoint called `STORE` into the parent directory and
//!   make the parent a store);
//! - a `..` anywhere is refused, so no path climbs out of the directory it starts from;
//! - a URL of another scheme (`http://`, `hf://`, `file://`) is refused, and so is one a
//!   path library folded (`s3:/bucket/x`, which Python's `pathlib.Path` makes of `s3://`):
//!   taken as a relative path it would write a directory called `s3:`;
//! - the name is a plain name: not empty, not starting with `.` (the store's own
//!   bookkeeping), not one of the store's files (`chunks`, `lock`, `sluice-ckpt.json`).

use std::path::{Path, PathBuf};

use crate::error::CkptError;

/// The store's marker file: its format and version.
pub const MARKER_FILE: &str = "sluice-ckpt.json";
/// The directory of content-addressed chunks.
pub const CHUNKS_DIR: &str = "chunks";
/// The store-wide lock: shared by saves and loads, exclusive for `gc`.
pub const LOCK_FILE: &str = "lock";
/// Grouped saves' markers, before the manifest is published.
pub const PENDING_DIR: &str = ".pending";

/// The longest checkpoint name: a file name on every Linux file system.
const MAX_NAME_BYTES: usize = 255;

/// A checked `STORE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CkptPath {
    /// The store's directory (`.` for a bare name).
    pub root: PathBuf,
    /// The checkpoint's name inside it.
    pub name: String,
}

impl CkptPath {
    /// Parses and checks `STORE/NAME`.
    pub fn parse(path: &str) -> Result<CkptPath, CkptError> {
        let url = check_path(path)?;
        let bad = |detail: &str| CkptError::InvalidArgument {
            what: format!("checkpoint path {path:?}"),
            detail: detail.to_string(),
        };
        if url {
            let (_, rest) = path.split_once("://").expect("an object URL has '://'");
            return match rest.trim_end_matches('/').rsplit_once('/') {
                Some((bucket_and_prefix, name)) if !path.ends_with('/') => {
                    check_name(name).map_err(|e| match e {
                        CkptError::InvalidArgument { detail, .. } => bad(&detail),
                        other => other,
                    })?;
                    Ok(CkptPath {
                        root: PathBuf::from(
                            &path[..path.len() - rest.len() + bucket_and_prefix.len()],
                        ),
                        name: name.to_string(),
                    })
                }
                _ => Err(bad(
                    "names no checkpoint: a checkpoint URL is STORE/NAME, e.g. \
                     s3://bucket/run/step-100",
                )),
            };
        }
        if path.ends_with('/') || path == "." {
            return Err(bad(
                "names no checkpoint: a checkpoint path is STORE/NAME, \
                            e.g. /ckpt/step-100 (it ends in '/')",
            ));
        }
        let (root, name) = match path.rsplit_once('/') {
            Some(("", name)) => (PathBuf::from("/"), name),
            Some((root, name)) => (PathBuf::from(root), name),
            None => (PathBuf::from("."), path),
        };
        if name == "." {
            return Err(bad(
                "names no checkpoint: a checkpoint path is STORE/NAME, e.g. /ckpt/step-100 \
                 (it ends in '/.')",
            ));
        }
        check_name(name).map_err(|e| match e {
            CkptError::InvalidArgument { detail, .. } => bad(&detail),
            other => other,
        })?;
        Ok(CkptPath {
            root,
            name: name.to_string(),
        })
    }

    /// Parses a path given as a [`Path`] (its bytes must be UTF-8).
    pub fn parse_path(path: &Path) -> Result<CkptPath, CkptError> {
        let s = path.to_str().ok_or_else(|| CkptError::InvalidArgument {
            what: format!("checkpoint path {}", path.display()),
            detail: "is not valid UTF-8".into(),
        })?;
        CkptPath::parse(s)
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> PathBuf {
        self.root.join(&self.name)
    }
}

impl std::fmt::Display for CkptPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.dir().display())
    }
}

/// Checks a store's path: a local path without `..`, or an object URL (`s3://`, `gs://`,
/// `az://`) with a bucket.
pub fn check_store_path(path: &Path) -> Result<(), CkptError> {
    let url = match path.to_str() {
        Some(s) => check_path(s)?,
        None => false, // not UTF-8: no URL; `..` is checked on the components below
    };
    if url {
        return Ok(());
    }
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(CkptError::InvalidArgument {
            what: format!("store path {}", path.display()),
            detail: "may not contain '..': give the store's path without it".into(),
        });
    }
    Ok(())
}

/// Whether a checkpoint or store path is an object URL (`true`) or a local path; refuses
/// other schemes, folded URLs and `..` components.
fn check_path(path: &str) -> Result<bool, CkptError> {
    if path.is_empty() {
        return Err(CkptError::InvalidArgument {
            what: "checkpoint path \"\"".into(),
            detail: "is empty: a checkpoint path is STORE/NAME, e.g. /ckpt/step-100".into(),
        });
    }
    if let Some(scheme) = url_scheme(path) {
        let bad = |detail: String| CkptError::InvalidArgument {
            what: format!("checkpoint path {path:?}"),
            detail,
        };
        if !path.contains("://") {
            return Err(bad(format!(
                "looks like a {scheme}:// URL with one slash (Python's pathlib.Path folds \
                 '{scheme}://' into '{scheme}:/'): pass the URL as a str"
            )));
        }
        let url = sluice_remote::ObjectUrl::parse(path).map_err(|e| match e {
            sluice_remote::RemoteError::BadUrl { why, .. } => bad(format!(
                "{why} (checkpoints go to a directory or to s3://, gs:// or az://)"
            )),
            other => CkptError::remote(other),
        })?;
        if url.key.split('/').any(|c| c == ".." || c == ".") {
            return Err(bad(
                "may not contain '.' or '..' components: give the prefix without them".into(),
            ));
        }
        return Ok(true);
    }
    if path.split('/').any(|c| c == "..") {
        return Err(CkptError::InvalidArgument {
            what: format!("checkpoint path {path:?}"),
            detail: "may not contain '..': give the store's path without it".into(),
        });
    }
    if path.contains('\0') {
        return Err(CkptError::InvalidArgument {
            what: format!("checkpoint path {path:?}"),
            detail: "contains a NUL byte".into(),
        });
    }
    Ok(false)
}

/// Whether a checked store path is an object URL.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| url_scheme(s).is_some())
}

/// Schemes of object stores and remote files, recognised even after a path library folded
/// `s3://b/x` into `s3:/b/x` (Python's `pathlib.Path` does).
const REMOTE_SCHEMES: &[&str] = &[
    "s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "http", "https", "hf", "file",
    "oss", "cos", "r2",
];

/// The scheme of `scheme://...` (RFC 3986: a letter, then letters, digits, `+ - .`), or of
/// `scheme:/...` for a known remote scheme.
fn url_scheme(path: &str) -> Option<&str> {
    let is_scheme = |s: &str| {
        let mut chars = s.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    };
    if let Some((scheme, _)) = path.split_once("://") {
        return is_scheme(scheme).then_some(scheme);
    }
    let (scheme, _) = path.split_once(":/")?;
    let known = REMOTE_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str());
    (is_scheme(scheme) && known).then_some(scheme)
}

/// Checks a checkpoint name: one plain file name that is not the store's own.
pub fn check_name(name: &str) -> Result<(), CkptError> {
    let bad = |detail: String| CkptError::InvalidArgument {
        what: format!("checkpoint name {name:?}"),
        detail,
    };
    if name.is_empty() {
        return Err(bad("is empty".into()));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(bad("must be a plain name (no '/' or NUL)".into()));
    }
    if name.starts_with('.') {
        return Err(bad(
            "must be a plain name, not starting with '.' (the store keeps its bookkeeping \
             there)"
                .into(),
        ));
    }
    if [CHUNKS_DIR, LOCK_FILE, MARKER_FILE].contains(&name) {
        return Err(bad(format!(
            "must be a plain name, not one of the store's own files ({CHUNKS_DIR}, \
             {LOCK_FILE}, {MARKER_FILE})"
        )));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad(format!(
            "is {} bytes long; at most {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(p: &str) -> (String, String) {
        let c = CkptPath::parse(p).unwrap();
        (c.root.display().to_string(), c.name)
    }

    #[test]
    fn store_and_name_are_split_at_the_last_slash() {
        assert_eq!(
            parsed("/ckpt/step-100"),
            ("/ckpt".into(), "step-100".into())
        );
        assert_eq!(parsed("ckpt/step-1"), ("ckpt".into(), "step-1".into()));
        assert_eq!(parsed("step-1"), (".".into(), "step-1".into()));
        assert_eq!(parsed("/step-1"), ("/".into(), "step-1".into()));
        assert_eq!(parsed("./ckpt/a@b"), ("./ckpt".into(), "a@b".into()));
    }

    #[test]
    fn a_path_that_names_no_checkpoint_is_refused() {
        for p in ["STORE/", "STORE/.", "STORE//", ".", "/", ""] {
            let e = CkptPath::parse(p).unwrap_err();
            assert!(matches!(e, CkptError::InvalidArgument { .. }), "{p}: {e}");
        }
        let e = CkptPath::parse("STORE/").unwrap_err().to_string();
        assert!(e.contains("STORE/") && e.contains("STORE/NAME"), "{e}");
    }

    #[test]
    fn dot_dot_anywhere_is_refused() {
        for p in ["../x", "STORE/../x", "a/../../b/c", "STORE/..", ".."] {
            let e = CkptPath::parse(p).unwrap_err().to_string();
            assert!(e.contains("'..'"), "{p}: {e}");
        }
        assert!(check_store_path(Path::new("a/../b")).is_err());
        assert!(check_store_path(Path::new("/a/b..c")).is_ok());
    }

    #[test]
    fn object_urls_split_into_a_prefix_and_a_name() {
        assert_eq!(
            parsed("s3://bucket/run/step-1"),
            ("s3://bucket/run".into(), "step-1".into())
        );
        assert_eq!(parsed("gs://b/x"), ("gs://b".into(), "x".into()));
        assert_eq!(parsed("az://c/a/b/x"), ("az://c/a/b".into(), "x".into()));
        assert!(check_store_path(Path::new("s3://bucket/run")).is_ok());
        assert!(check_store_path(Path::new("s3://bucket")).is_ok());
        assert!(is_url(Path::new("s3://bucket")));
        assert!(!is_url(Path::new("/tmp/s3")));
        for p in [
            "s3://bucket",
            "s3://bucket/",
            "s3://bucket/run/",
            "s3://b/run/..",
            "s3://b/./x",
        ] {
            let e = CkptPath::parse(p).unwrap_err();
            assert!(matches!(e, CkptError::InvalidArgument { .. }), "{p}: {e}");
        }
    }

    #[test]
    fn other_schemes_and_folded_urls_are_refused_naming_them() {
        for p in [
            "file:///tmp/x",
            "http://host/x",
            "hf://org/model/x",
            "s3:/bucket/run/step-1", // what pathlib.Path makes of an s3:// URL
        ] {
            let e = CkptPath::parse(p).unwrap_err();
            assert!(matches!(e, CkptError::InvalidArgument { .. }), "{p}: {e}");
            assert!(e.to_string().contains(p), "{e}");
        }
        let e = CkptPath::parse("s3:/bucket/x").unwrap_err().to_string();
        assert!(e.contains("pathlib"), "{e}");
        // A colon that is no scheme is a plain name.
        assert_eq!(parsed("ckpt/a:b"), ("ckpt".into(), "a:b".into()));
        assert_eq!(parsed("c:/x"), ("c:".into(), "x".into()));
    }

    #[test]
    fn names_the_store_uses_itself_are_refused() {
        for n in [
            "chunks",
            "lock",
            "sluice-ckpt.json",
            ".pending",
            ".x",
            "",
            "a/b",
        ] {
            assert!(check_name(n).is_err(), "{n}");
        }
        assert!(check_name(&"x".repeat(256)).is_err());
        assert!(check_name(&"x".repeat(255)).is_ok());
    }
}
