//! Memory cgroups: where a process sits, which memory limit applies to
//! it, and cgroups of our own for a service and its prefetch.
//!
//! - [`hierarchy`](self) internals find a process's memory cgroup from
//!   `/proc/<pid>/cgroup` and `/proc/self/mountinfo` (v1 memory controller
//!   or the v2 unified hierarchy).
//! - [`memory_limit_in`] and friends: the tightest limit that applies, and
//!   what is charged against it, with `/proc/meminfo` as the fallback; a
//!   [`Watermark`] over it.
//! - [`create_cgroup`] and [`Cgroup`]: a cgroup with a limit, processes
//!   moved in, usage read, removal.
//!
//! Page cache is charged to the cgroup that first faults it in and stays
//! there until it is dropped: a daemon prefetching for a job spends its own
//! budget, not the job's, so the daemon's cgroup ([`create_cgroup`]) is
//! where the budget is enforced.

mod hierarchy;
mod memory_limit;

use std::path::{Path, PathBuf};

use crate::os_error::OsError;
use hierarchy::{locate, parse_mountinfo, parse_proc_cgroup};

pub use memory_limit::{
    memory_limit_for_pid, memory_limit_in, own_cgroup_memory_limit, MemoryLimit, Watermark,
};

/// v1 limits at or above this mean "no limit": the kernel stores
/// `PAGE_COUNTER_MAX` pages, about 2^63 bytes, rounded to pages.
const V1_UNLIMITED: u64 = 1 << 62;

/// The cgroup interface version of a hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// Legacy per-controller hierarchies (`memory.limit_in_bytes`).
    V1,
    /// The unified hierarchy (`memory.max`).
    V2,
}

/// The memory cgroup `pid` belongs to, when it has one (v1 memory
/// controller, or v2 with memory enabled).
pub fn memory_cgroup_of(pid: i32) -> Option<Cgroup> {
    let cgroup_file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = std::fs::read_to_string(&cgroup_file).ok()?;
    let memberships = parse_proc_cgroup(&text, &cgroup_file).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mountinfo(&text, Path::new("/sys")))
        .unwrap_or_default();
    let place = locate(&memberships, &mounts, Path::new("/sys"))?;
    Some(Cgroup {
        version: place.version,
        path: place.dir,
    })
}

/// An I/O error of kind `InvalidData` naming `path`: a /proc, /sys or
/// cgroup file whose text is not what the kernel writes.
fn invalid(path: &Path, message: String) -> OsError {
    OsError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
    }
}

/// Limit and usage file names of a version.
fn files(version: CgroupVersion) -> (&'static str, &'static str) {
    match version {
        CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        CgroupVersion::V2 => ("memory.max", "memory.current"),
    }
}

/// A limit file: `None` for "unlimited" or a missing file.
fn read_limit(file: &Path, version: CgroupVersion) -> Result<Option<u64>, OsError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(OsError::io(file)(e)),
    };
    let text = text.trim();
    if version == CgroupVersion::V2 && text == "max" {
        return Ok(None);
    }
    let value = parse_bytes(text, file)?;
    Ok((version == CgroupVersion::V2 || value < V1_UNLIMITED).then_some(value))
}

fn read_number(file: &Path) -> Result<u64, OsError> {
    let text = std::fs::read_to_string(file).map_err(OsError::io(file))?;
    parse_bytes(text.trim(), file)
}

fn parse_bytes(text: &str, file: &Path) -> Result<u64, OsError> {
    text.parse::<u64>()
        .map_err(|_| invalid(file, format!("{text:?} is not a byte count")))
}

/// A memory cgroup this process created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// Its hierarchy's interface version.
    pub version: CgroupVersion,
    /// Its directory.
    pub path: PathBuf,
}

/// Creates memory cgroup `name` at the top of the v2 hierarchy when that has
/// the memory controller enabled for children (`cgroup.subtree_control`),
/// else of the v1 memory hierarchy, with `limit` bytes as its
/// `memory.max` / `memory.limit_in_bytes` when given.
///
/// Errors: [`OsError::InvalidArgument`] for a name that is empty, `.`, `..` or has
/// a `/`; [`OsError::Unsupported`] when neither hierarchy has the memory
/// controller; [`OsError::Io`] naming the directory or file otherwise
/// (no permission, a cgroup of that name already exists).
pub fn create_cgroup(name: &str, limit: Option<u64>) -> Result<Cgroup, OsError> {
    let (version, parent) = memory_hierarchy()?;
    create_cgroup_at(version, &parent, name, limit)
}

/// Where [`create_cgroup`] creates cgroups: the top of the v2 hierarchy when
/// it has the memory controller enabled for children, else of the v1 memory
/// hierarchy; [`OsError::Unsupported`] when neither has it.
pub fn memory_hierarchy() -> Result<(CgroupVersion, PathBuf), OsError> {
    let sys_root = Path::new("/sys");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mountinfo(&text, sys_root))
        .unwrap_or_default();
    let v2 = mounts
        .iter()
        .find(|m| m.version == CgroupVersion::V2 && m.root == "/")
        .map(|m| m.point.clone())
        .or_else(|| {
            [
                sys_root.join("fs/cgroup/unified"),
                sys_root.join("fs/cgroup"),
            ]
            .into_iter()
            .find(|p| p.join("cgroup.controllers").is_file())
        });
    if let Some(point) = v2 {
        let enabled = std::fs::read_to_string(point.join("cgroup.subtree_control"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"));
        if enabled {
            return Ok((CgroupVersion::V2, point));
        }
    }
    let v1 = mounts
        .iter()
        .find(|m| m.version == CgroupVersion::V1 && m.root == "/")
        .map(|m| m.point.clone())
        .unwrap_or_else(|| sys_root.join("fs/cgroup/memory"));
    if v1.join("memory.limit_in_bytes").is_file() {
        return Ok((CgroupVersion::V1, v1));
    }
    Err(OsError::Unsupported {
        feature: "memory cgroup",
        reason: format!(
            "no cgroup v2 hierarchy with memory in cgroup.subtree_control and no v1 memory \
             hierarchy at {}",
            v1.display()
        ),
    })
}

/// Creates cgroup `name` of `version` under directory `parent` and sets its
/// limit: the core of [`create_cgroup`], usable on a fake tree.
pub fn create_cgroup_at(
    version: CgroupVersion,
    parent: &Path,
    name: &str,
    limit: Option<u64>,
) -> Result<Cgroup, OsError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(OsError::InvalidArgument {
            what: "cgroup name".into(),
            value: format!("{name:?}"),
            expected: "must be one non-empty path component",
        });
    }
    let path = parent.join(name);
    std::fs::create_dir(&path).map_err(OsError::io(&path))?;
    let cgroup = Cgroup { version, path };
    if let Some(bytes) = limit {
        let file = cgroup.path.join(files(version).0);
        if let Err(e) = std::fs::write(&file, bytes.to_string()) {
            let _ = std::fs::remove_dir(&cgroup.path);
            return Err(OsError::io(&file)(e));
        }
    }
    Ok(cgroup)
}

impl Cgroup {
    /// Moves process `pid` (all its threads) into this cgroup.
    pub fn add_pid(&self, pid: i32) -> Result<(), OsError> {
        let file = self.path.join("cgroup.procs");
        std::fs::write(&file, pid.to_string()).map_err(OsError::io(&file))
    }

    /// Bytes charged to this cgroup now (`memory.current` /
    /// `memory.usage_in_bytes`).
    pub fn usage(&self) -> Result<u64, OsError> {
        read_number(&self.path.join(files(self.version).1))
    }

    /// This cgroup's own limit, `None` when unlimited.
    pub fn limit(&self) -> Result<Option<u64>, OsError> {
        let file = self.path.join(files(self.version).0);
        match read_limit(&file, self.version)? {
            Some(limit) => Ok(Some(limit)),
            None if file.exists() => Ok(None),
            None => Err(OsError::io(&file)(std::io::ErrorKind::NotFound.into())),
        }
    }

    /// Removes the cgroup (`rmdir`). Processes are not moved out: with any
    /// left inside this fails (`EBUSY`), naming the directory.
    pub fn remove(self) -> Result<(), OsError> {
        std::fs::remove_dir(&self.path).map_err(OsError::io(&self.path))
    }

    /// The processes in this cgroup now (`cgroup.procs`), in no order.
    pub fn pids(&self) -> Result<Vec<i32>, OsError> {
        let file = self.path.join("cgroup.procs");
        let text = std::fs::read_to_string(&file).map_err(OsError::io(&file))?;
        Ok(text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// Sends SIGKILL to every process in this cgroup; returns how many were
    /// in it. On v2 (Linux 5.14+) through `cgroup.kill`, which also takes
    /// processes forked while it runs; elsewhere to each pid `cgroup.procs`
    /// lists, so a process forked meanwhile needs another call (callers
    /// repeat until [`Cgroup::pids`] is empty). The caller must not be in
    /// it.
    pub fn kill_all(&self) -> Result<usize, OsError> {
        let pids = self.pids()?;
        let kill_file = self.path.join("cgroup.kill");
        if self.version == CgroupVersion::V2 && std::fs::write(&kill_file, "1").is_ok() {
            return Ok(pids.len());
        }
        for &pid in &pids {
            // SAFETY: kill(2) has no memory effects; a pid that exited
            // meanwhile gives ESRCH, which is what we wanted.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        Ok(pids.len())
    }

    /// Processes the kernel's OOM killer killed in this cgroup since it was
    /// created: `oom_kill` in `memory.events` (v2) or `memory.oom_control`
    /// (v1, Linux 4.13+). `None` where the kernel does not count them.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        };
        let text = std::fs::read_to_string(self.path.join(file)).ok()?;
        oom_kill_count(&text)
    }
}

/// The `oom_kill N` line of `memory.events` or `memory.oom_control`.
fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn memory_cgroup_of_a_process_is_found_or_none() {
        // This process: a directory that exists when it has a memory cgroup.
        if let Some(cg) = memory_cgroup_of(std::process::id() as i32) {
            assert!(cg.path.is_dir(), "{cg:?}");
            assert!(cg.usage().is_ok());
        }
        assert_eq!(memory_cgroup_of(i32::MAX), None);
    }

    #[test]
    fn fake_cgroup_create_add_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(
                create_cgroup_at(CgroupVersion::V2, dir.path(), bad, None),
                Err(OsError::InvalidArgument { .. })
            ));
        }
        let cg = create_cgroup_at(CgroupVersion::V2, dir.path(), "w", Some(64 * MIB)).unwrap();
        assert_eq!(cg.limit().unwrap(), Some(64 * MIB));
        cg.add_pid(123).unwrap();
        assert_eq!(
            std::fs::read_to_string(cg.path.join("cgroup.procs")).unwrap(),
            "123"
        );
        match cg.usage() {
            Err(OsError::Io { path, .. }) => assert!(path.ends_with("w/memory.current")),
            other => panic!("{other:?}"),
        }
        // Same name twice: an error naming the directory.
        match create_cgroup_at(CgroupVersion::V2, dir.path(), "w", None) {
            Err(OsError::Io { path, .. }) => assert_eq!(path, dir.path().join("w")),
            other => panic!("{other:?}"),
        }
        // A plain directory with files is not empty: rmdir fails, named.
        match cg.clone().remove() {
            Err(OsError::Io { path, .. }) => assert_eq!(path, dir.path().join("w")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oom_kills_are_read_from_either_versions_file() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        let v2 = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v1), Some(2));
        assert_eq!(oom_kill_count(v2), Some(1));
        assert_eq!(oom_kill_count("oom_kill_disable 0\n"), None);
        let dir = tempfile::tempdir().unwrap();
        let cg = create_cgroup_at(CgroupVersion::V1, dir.path(), "w", None).unwrap();
        assert_eq!(cg.oom_kills(), None, "no file: not counted");
        std::fs::write(cg.path.join("memory.oom_control"), v1).unwrap();
        assert_eq!(cg.oom_kills(), Some(2));
        std::fs::write(cg.path.join("cgroup.procs"), "12\n34\n").unwrap();
        assert_eq!(cg.pids().unwrap(), vec![12, 34]);
    }

    #[test]
    fn real_cgroup_with_a_limit_is_created_and_removed() {
        // SAFETY: geteuid has no side effects.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: creating a cgroup needs root");
            return;
        }
        let name = format!("sluice-warm-test-{}", std::process::id());
        let cg = match create_cgroup(&name, Some(64 * MIB)) {
            Ok(cg) => cg,
            Err(e @ OsError::Unsupported { .. }) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(OsError::Io { path, source })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::EROFS)
                ) =>
            {
                eprintln!("skipped: {}: {source}", path.display());
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let path = cg.path.clone();
        let checks = (cg.limit(), cg.usage());
        // A process inside keeps it from being removed until it is killed.
        let mut sleeper = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        cg.add_pid(sleeper.id() as i32).unwrap();
        assert_eq!(cg.pids().unwrap(), vec![sleeper.id() as i32]);
        assert!(
            cg.clone().remove().is_err(),
            "busy while the process is in it"
        );
        assert_eq!(cg.kill_all().unwrap(), 1);
        let status = sleeper.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert_eq!(cg.oom_kills(), Some(0));
        cg.remove().unwrap();
        assert!(!path.exists(), "{} still there", path.display());
        assert_eq!(checks.0.unwrap(), Some(64 * MIB));
        assert!(checks.1.unwrap() < MIB);
    }
}
