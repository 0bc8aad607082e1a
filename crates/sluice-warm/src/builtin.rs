//! The built-in policies, chosen by name:
//!
//! - `native`: does nothing; the kernel's own readahead and LRU (baseline).
//! - `eager`: on the first access, prefetch every model file at full
//!   concurrency (one stream per file); never evict.
//! - `precache`: prefetch every model file before the service starts.
//! - `template`: seed 000's MAIO. Without a template for the service it
//!   records one (each worker's ordered, merged accesses) and writes it at
//!   exit; with one it replays it: each access locates the worker's reader
//!   in its sequence and prefetches from there to the end (interruptible:
//!   the next access supersedes it), placed near the worker's accelerator;
//!   when memory is short it burns what the reader passed more than
//!   `bar_distance_bytes` ago, unless some worker still has it ahead.

//!
//! One file per policy under `builtin/`; this module is the registry.

mod eager;
mod native;
mod precache;
mod template_policy;
#[cfg(test)]
mod test_support;

use std::path::PathBuf;

use crate::error::WarmConfigError;
use crate::error::WarmError;
use crate::policy::{FileRange, PolicyContext, Prefetch, WarmPolicy};
use crate::template::ServiceId;

pub use eager::Eager;
pub use native::Native;
pub use precache::Precache;
pub use template_policy::TemplatePolicy;

/// Names [`by_name`] accepts.
pub const BUILTIN_NAMES: [&str; 4] = ["native", "eager", "precache", "template"];

/// Knobs of the built-ins (only `template` reads most of them).
#[derive(Clone, Debug)]
pub struct BuiltinConfig {
    /// The service whose template to record or replay.
    pub service: Option<ServiceId>,
    /// The spec the service id was hashed from, kept in new templates.
    pub spec: String,
    /// Where templates live (may be shared storage).
    pub template_dir: Option<PathBuf>,
    /// Prefetch along the template (off: the "no prefetch" breakdown).
    pub prefetch: bool,
    /// Place prefetched pages near each worker's accelerator.
    pub affinity: bool,
    /// Evict what readers passed, when memory is limited.
    pub burn_after_reading: bool,
    /// Record a new template even when one exists (`sluice warm record`).
    pub record: bool,
    /// Replay from the start of every worker's sequence as soon as the
    /// runtime starts, without waiting for a first access. Right for `run`,
    /// which launches the service itself (the launch is the first event); a
    /// daemon does not know when a service starts and waits for one.
    pub start_at_launch: bool,
    /// How far behind the reader eviction stops. 1 GiB, seed 000's default:
    /// data just read may not have reached the accelerator yet.
    pub bar_distance_bytes: u64,
}

impl Default for BuiltinConfig {
    fn default() -> BuiltinConfig {
        BuiltinConfig {
            service: None,
            spec: String::new(),
            template_dir: None,
            prefetch: true,
            affinity: true,
            burn_after_reading: true,
            record: false,
            start_at_launch: false,
            bar_distance_bytes: 1 << 30,
        }
    }
}

/// A built-in policy by name, or a Python policy for a `module:Class`
/// name (started now, see [`crate::python::spawn`]); the error lists the
/// names.
pub fn by_name(name: &str, config: &BuiltinConfig) -> Result<Box<dyn WarmPolicy>, WarmError> {
    if name.contains(':') {
        return Ok(Box::new(crate::python::spawn(name, None)?));
    }
    Ok(match name {
        "native" => Box::new(Native),
        "eager" => Box::new(Eager::default()),
        "precache" => Box::new(Precache),
        "template" => Box::new(TemplatePolicy::new(config.clone())?),
        other => {
            return Err(WarmConfigError::UnknownPolicy {
                name: other.to_string(),
                known: BUILTIN_NAMES.join(", "),
            }
            .into())
        }
    })
}

/// Every model file, whole, one stream each.
pub(crate) fn whole_model(ctx: &PolicyContext) -> Vec<Prefetch> {
    ctx.files
        .iter()
        .enumerate()
        .map(|(i, (path, size))| Prefetch {
            stream: i as u32,
            range: FileRange::new(path, 0, *size),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::test_support::{ctx, event};
    use super::*;
    use crate::policy::AccessKind;

    #[test]
    fn eager_prefetches_everything_once_and_precache_at_init() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path(), &[("a", 10), ("b", 20)]);
        let mut eager = by_name("eager", &BuiltinConfig::default()).unwrap();
        assert!(eager.init(&c).unwrap().is_empty());
        let e = event(dir.path(), 1, "a", 0, 1, AccessKind::Open);
        let plan = eager.on_access(&e).unwrap();
        assert_eq!(plan.len(), 2);
        assert_eq!((plan[1].stream, plan[1].range.len), (1, 20));
        assert!(eager.on_access(&e).unwrap().is_empty());
        assert!(eager.evict(None).unwrap().is_empty());
        let mut pre = by_name("precache", &BuiltinConfig::default()).unwrap();
        assert!(pre.wait_for_init());
        assert_eq!(pre.init(&c).unwrap().len(), 2);
        let mut native = by_name("native", &BuiltinConfig::default()).unwrap();
        assert!(native.on_access(&e).unwrap().is_empty());
    }

    #[test]
    fn a_start_up_failure_reaches_the_runtime_as_a_python_error() {
        let err = by_name("not-a-module:C", &BuiltinConfig::default())
            .err()
            .expect("refused");
        assert!(
            matches!(&err, WarmError::Python(crate::python::PythonError::BadSpec { spec }) if spec == "not-a-module:C"),
            "{err:?}"
        );
    }
}
