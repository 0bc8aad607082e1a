//! [`WarmEnv`]: the environment a warm runtime reads (template and run directories, the
//! NUMA map), read once; every `SLUICE_*` override found is logged.

use std::ffi::OsString;
use std::path::PathBuf;

/// The environment of a warm runtime, read once.
#[derive(Clone, Debug, Default)]
pub struct WarmEnv {
    /// `$SLUICE_TEMPLATE_DIR`: where templates live when no flag says.
    pub template_dir: Option<PathBuf>,
    /// `$XDG_CACHE_HOME`, else `$HOME/.cache`: templates go under it
    /// otherwise.
    pub cache_home: Option<PathBuf>,
    /// `$SLUICE_RUN_DIR`: where runtimes publish their status and triggers.
    pub run_dir: Option<PathBuf>,
    /// `$XDG_RUNTIME_DIR`: the run directory's parent for non-root users.
    pub runtime_home: Option<PathBuf>,
    /// `$SLUICE_NUMA_MAP`: accelerator → NUMA node, instead of PCI sysfs.
    pub numa_map: Option<String>,
}

impl WarmEnv {
    /// The process's environment.
    pub fn from_env() -> WarmEnv {
        WarmEnv::from_vars(|name| std::env::var_os(name))
    }

    /// The environment as `var` reports it; each `SLUICE_*` override found
    /// is logged.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> WarmEnv {
        let logged = |name: &str| {
            let value = var(name)?;
            tracing::info!("{name}={}", value.to_string_lossy());
            Some(value)
        };
        let cache_home = var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")));
        WarmEnv {
            template_dir: logged("SLUICE_TEMPLATE_DIR").map(PathBuf::from),
            cache_home,
            run_dir: logged("SLUICE_RUN_DIR").map(PathBuf::from),
            runtime_home: var("XDG_RUNTIME_DIR").map(PathBuf::from),
            numa_map: logged(sluice_engine::numa::NUMA_MAP_ENV)
                .map(|v| v.to_string_lossy().into_owned()),
        }
    }

    /// The template directory: `flag`, `$SLUICE_TEMPLATE_DIR`,
    /// `$XDG_CACHE_HOME/sluice/templates`, `~/.cache/sluice/templates`,
    /// else `/var/cache/sluice/templates`.
    pub fn template_dir(&self, flag: Option<PathBuf>) -> PathBuf {
        if let Some(dir) = flag.or_else(|| self.template_dir.clone()) {
            return dir;
        }
        let cache = self
            .cache_home
            .clone()
            .unwrap_or_else(|| PathBuf::from("/var/cache"));
        cache.join("sluice/templates")
    }

    /// Where runtimes publish their status files and trigger pipes:
    /// `$SLUICE_RUN_DIR`, `/run/sluice/warm` for root,
    /// `$XDG_RUNTIME_DIR/sluice/warm`, else `/tmp/sluice-warm-UID`.
    pub fn run_dir(&self) -> PathBuf {
        if let Some(dir) = &self.run_dir {
            return dir.clone();
        }
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        if uid == 0 {
            return PathBuf::from("/run/sluice/warm");
        }
        match &self.runtime_home {
            Some(dir) => dir.join("sluice/warm"),
            None => PathBuf::from(format!("/tmp/sluice-warm-{uid}")),
        }
    }

    /// The trigger pipe of the runtime with process id `pid`.
    pub fn trigger_pipe(&self, pid: i32) -> PathBuf {
        self.run_dir().join(format!("{pid}.trigger"))
    }
}
