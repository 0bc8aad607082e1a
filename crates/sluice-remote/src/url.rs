//! [`ObjectUrl`]: `s3://bucket/key`, `gs://bucket/key`, `az://container/key`.

use std::fmt;

use crate::error::RemoteError;

/// Which object store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    S3,
    Gcs,
    Azure,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
        }
    }
}

/// An object (or a prefix of objects) in a bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectUrl {
    pub scheme: Scheme,
    pub bucket: String,
    /// The key, without a leading `/`; empty for the whole bucket.
    pub key: String,
}

impl ObjectUrl {
    /// The URL prefixes of the stores this crate reaches.
    const KNOWN: [&'static str; 3] = ["s3://", "gs://", "az://"];

    /// Whether `s` looks like an object URL at all (a scheme this crate knows), so that
    /// callers can tell URLs from local paths before parsing.
    ///
    /// Any other `scheme://…` (`http://`, `s3a://`, `S3://`) counts too unless a local path
    /// of that name exists, so that it gets [`ObjectUrl::parse`]'s error naming the schemes
    /// known, not "no such file".
    pub fn is_url(s: &str) -> bool {
        Self::KNOWN.iter().any(|p| s.starts_with(p))
            || (has_scheme(s) && std::fs::symlink_metadata(s).is_err())
    }

    pub fn parse(s: &str) -> Result<ObjectUrl, RemoteError> {
        if has_scheme(s) && !Self::KNOWN.iter().any(|p| s.starts_with(p)) {
            let scheme = s.split_once("://").map_or("", |(scheme, _)| scheme);
            return Err(RemoteError::BadUrl {
                url: s.to_string(),
                why: format!("the scheme {scheme:?} is not supported: use s3://, gs:// or az://"),
            });
        }
        let bad = |why: &str| RemoteError::BadUrl {
            url: s.to_string(),
            why: why.to_string(),
        };
        let (scheme, rest) = if let Some(r) = s.strip_prefix("s3://") {
            (Scheme::S3, r)
        } else if let Some(r) = s.strip_prefix("gs://") {
            (Scheme::Gcs, r)
        } else if let Some(r) = s.strip_prefix("az://") {
            (Scheme::Azure, r)
        } else {
            return Err(bad("expected s3://, gs:// or az://"));
        };
        if s.contains('\0') {
            return Err(bad("it contains a NUL byte"));
        }
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket name"));
        }
        if !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return Err(bad("a bucket name is letters, digits, '-', '.' and '_'"));
        }
        let key = key.trim_start_matches('/');
        if key.split('/').any(|seg| seg == "." || seg == "..") {
            return Err(bad("'.' and '..' are not key segments"));
        }
        Ok(ObjectUrl {
            scheme,
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// The URL of `name` under this one taken as a prefix.
    pub fn join(&self, name: &str) -> ObjectUrl {
        let key = if self.key.is_empty() || self.key.ends_with('/') {
            format!("{}{name}", self.key)
        } else {
            format!("{}/{name}", self.key)
        };
        ObjectUrl {
            key,
            ..self.clone()
        }
    }
}

impl fmt::Display for ObjectUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}/{}", self.scheme.as_str(), self.bucket, self.key)
    }
}

/// Whether `s` starts like a URL: `scheme://` with an RFC 3986 scheme (a letter, then
/// letters, digits, `+`, `-` or `.`).
fn has_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn urls_parse_into_scheme_bucket_and_key() {
        let u = ObjectUrl::parse("s3://models/llama/model-00001.safetensors").unwrap();
        assert_eq!((u.scheme, u.bucket.as_str()), (Scheme::S3, "models"));
        assert_eq!(u.key, "llama/model-00001.safetensors");
        assert_eq!(u.to_string(), "s3://models/llama/model-00001.safetensors");
        assert_eq!(ObjectUrl::parse("gs://b").unwrap().key, "");
        assert_eq!(ObjectUrl::parse("az://c//k").unwrap().key, "k");
        assert_eq!(
            ObjectUrl::parse("s3://b/dir/")
                .unwrap()
                .join("x")
                .to_string(),
            "s3://b/dir/x"
        );
        assert_eq!(
            ObjectUrl::parse("s3://b/dir").unwrap().join("x").key,
            "dir/x"
        );
    }

    #[test]
    fn bad_urls_are_refused_naming_the_url() {
        for bad in [
            "/local/path",
            "http://x/y",
            "s3://",
            "s3:///key",
            "s3://b a/k",
            "s3://b/../etc",
            "s3://b/a/./c",
            "s3://b/\0",
        ] {
            let e = ObjectUrl::parse(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    proptest! {
        #[test]
        fn any_string_parses_or_is_refused_without_panicking(s in ".{0,64}") {
            let _ = ObjectUrl::parse(&s);
        }

        #[test]
        fn parsed_urls_print_back_to_an_equal_url(
            bucket in "[a-z0-9][a-z0-9.-]{0,20}",
            key in "([a-zA-Z0-9_-]{1,8}/){0,3}[a-zA-Z0-9_.-]{0,12}",
        ) {
            prop_assume!(!key.split('/').any(|s| s == "." || s == ".."));
            let u = ObjectUrl::parse(&format!("s3://{bucket}/{key}")).unwrap();
            prop_assert_eq!(ObjectUrl::parse(&u.to_string()).unwrap(), u);
        }
    }
}
