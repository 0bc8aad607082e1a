//! The memory budget: which limit applies to a process, a watermark over it,
//! and cgroups for the daemon and its workers.
//!
//! Finding the limit ([`memory_limit_in`]):
//! 1. `/proc/<pid>/cgroup` says where the process sits: v1 lines
//!    `N:memory:/path` (controllers comma-separated), the v2 line `0::/path`.
//! 2. `/proc/self/mountinfo` says where each hierarchy is mounted (a v1
//!    `cgroup` mount whose options name `memory`, a `cgroup2` mount) and
//!    which of it the mount shows (its root field, not `/` under a
//!    bind-mounted or namespaced subtree). Without mountinfo we probe
//!    `/sys/fs/cgroup/memory`, then `/sys/fs/cgroup/unified` and
//!    `/sys/fs/cgroup`. The v1 memory controller wins when the process has
//!    one; v2 counts only when its root lists `memory` in
//!    `cgroup.controllers`.
//! 3. From the process's cgroup up to the mount root, the tightest limit
//!    applies (a parent's limit caps its children): v1
//!    `memory.limit_in_bytes` (values ≥ 2^62 mean "unlimited": the kernel
//!    writes `PAGE_COUNTER_MAX` pages there) with `memory.usage_in_bytes`,
//!    v2 `memory.max` (`max` = unlimited) with `memory.current`. Levels
//!    without the files (the v2 root) are skipped.
//! 4. No limit, or one above the machine's memory: `/proc/meminfo`, limit
//!    `MemTotal`, usage `MemTotal - MemAvailable`.
//!
//! Page cache is charged to the cgroup that first faults it in and stays
//! there until it is dropped: a daemon prefetching for a job spends its own
//! budget, not the job's, so the daemon's cgroup ([`create_cgroup`]) is
//! where the budget is enforced.

use std::path::{Component, Path, PathBuf};

use crate::error::WarmError;

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

/// The memory limit that applies to a process and what it uses of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Where the numbers come from, for logs: e.g.
    /// `cgroup v2 /sys/fs/cgroup/unified/x/memory.max` or
    /// `meminfo /proc/meminfo`.
    pub source: String,
    /// The limit in bytes.
    pub limit: u64,
    /// Bytes charged against it now (page cache included).
    pub usage: u64,
}

/// A fraction of a memory limit above which the warm plane stops
/// prefetching and starts evicting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watermark {
    /// Fraction of the limit, in (0, 1].
    pub fraction: f64,
}

impl Default for Watermark {
    /// 0.8: leaves a fifth of the limit for the job's own allocations and
    /// for the reads in flight when the watermark is crossed, before the
    /// kernel starts reclaiming on its own.
    fn default() -> Self {
        Watermark { fraction: 0.8 }
    }
}

impl Watermark {
    /// A watermark at `fraction` of the limit; [`WarmError::Config`] unless
    /// `0 < fraction <= 1`.
    pub fn new(fraction: f64) -> Result<Watermark, WarmError> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Watermark { fraction })
        } else {
            Err(WarmError::Config(format!(
                "memory watermark {fraction}: must be in (0, 1]"
            )))
        }
    }

    /// The watermark in bytes for `m` (a fraction outside (0, 1] is clamped,
    /// NaN counts as 0).
    pub fn threshold(&self, m: &MemoryLimit) -> u64 {
        let fraction = if self.fraction.is_nan() {
            0.0
        } else {
            self.fraction.clamp(0.0, 1.0)
        };
        (fraction * m.limit as f64) as u64
    }

    /// Whether usage has reached the watermark.
    pub fn over(&self, m: &MemoryLimit) -> bool {
        m.usage >= self.threshold(m)
    }

    /// Bytes that may still be cached before the watermark; 0 when over.
    pub fn headroom(&self, m: &MemoryLimit) -> u64 {
        self.threshold(m).saturating_sub(m.usage)
    }
}

/// The memory limit of the current process.
pub fn own_cgroup_memory_limit() -> Result<MemoryLimit, WarmError> {
    memory_limit_in(Path::new("/proc"), Path::new("/sys"), None)
}

/// The memory limit of process `pid`.
pub fn memory_limit_for_pid(pid: i32) -> Result<MemoryLimit, WarmError> {
    memory_limit_in(Path::new("/proc"), Path::new("/sys"), Some(pid))
}

/// The memory limit of `pid` (or the caller) under a procfs and a sysfs
/// root: the algorithm of the module doc. Mount points under `/sys` in
/// mountinfo are read under `sys_root`, so a fake tree works as a test.
///
/// Errors: [`WarmError::Io`] naming the file when `<pid>/cgroup` cannot be
/// read (for `Some(pid)`), or when a cgroup or meminfo file is garbage
/// (`InvalidData`, with the text).
pub fn memory_limit_in(
    proc_root: &Path,
    sys_root: &Path,
    pid: Option<i32>,
) -> Result<MemoryLimit, WarmError> {
    let who = pid.map_or_else(|| "self".to_string(), |p| p.to_string());
    let cgroup_file = proc_root.join(who).join("cgroup");
    let memberships = match std::fs::read_to_string(&cgroup_file) {
        Ok(text) => parse_proc_cgroup(&text, &cgroup_file)?,
        Err(e) if pid.is_none() && e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(WarmError::io(&cgroup_file)(e)),
    };
    let mounts = std::fs::read_to_string(proc_root.join("self/mountinfo"))
        .map(|text| parse_mountinfo(&text, sys_root))
        .unwrap_or_default();
    let meminfo = proc_root.join("meminfo");
    let Some(place) = locate(&memberships, &mounts, sys_root) else {
        return read_meminfo(&meminfo);
    };
    let Some(limit) = tightest_limit(&place)? else {
        return read_meminfo(&meminfo);
    };
    match read_meminfo(&meminfo) {
        Ok(machine) if machine.limit < limit.limit => Ok(machine),
        _ => Ok(limit),
    }
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

/// One line of `/proc/<pid>/cgroup`.
#[derive(Debug)]
struct Membership {
    hierarchy: String,
    controllers: Vec<String>,
    path: String,
}

fn invalid(path: &Path, message: String) -> WarmError {
    WarmError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, message),
    }
}

fn parse_proc_cgroup(text: &str, file: &Path) -> Result<Vec<Membership>, WarmError> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(hierarchy), Some(controllers), Some(path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid(
                file,
                format!("line {}: {line:?} is not id:controllers:path", number + 1),
            ));
        };
        if hierarchy.parse::<u32>().is_err() || !path.starts_with('/') {
            return Err(invalid(
                file,
                format!("line {}: {line:?} is not id:controllers:/path", number + 1),
            ));
        }
        out.push(Membership {
            hierarchy: hierarchy.to_string(),
            controllers: controllers
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect(),
            path: path.to_string(),
        });
    }
    Ok(out)
}

/// A cgroup hierarchy mount from mountinfo.
#[derive(Debug)]
struct CgroupMount {
    version: CgroupVersion,
    /// Which part of the hierarchy the mount shows (`/` usually).
    root: String,
    /// Where it is mounted, rebased under the sysfs root.
    point: PathBuf,
}

fn parse_mountinfo(text: &str, sys_root: &Path) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let tail: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (fields.get(3), fields.get(4), tail.first())
        else {
            continue;
        };
        let version = match *fstype {
            "cgroup2" => CgroupVersion::V2,
            "cgroup"
                if tail
                    .get(2)
                    .is_some_and(|o| o.split(',').any(|o| o == "memory")) =>
            {
                CgroupVersion::V1
            }
            _ => continue,
        };
        out.push(CgroupMount {
            version,
            root: unescape(root),
            point: rebase(Path::new(&unescape(point)), sys_root),
        });
    }
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/sys/x` read under `sys_root` instead, so fake trees work.
fn rebase(point: &Path, sys_root: &Path) -> PathBuf {
    match point.strip_prefix("/sys") {
        Ok(rest) => sys_root.join(rest),
        Err(_) => point.to_path_buf(),
    }
}

/// Where a process's memory cgroup is: its version, its directory and the
/// mount point above which the walk stops.
#[derive(Debug)]
struct Place {
    version: CgroupVersion,
    dir: PathBuf,
    top: PathBuf,
}

fn locate(memberships: &[Membership], mounts: &[CgroupMount], sys_root: &Path) -> Option<Place> {
    let v1 = memberships
        .iter()
        .find(|m| m.controllers.iter().any(|c| c == "memory"));
    if let Some(member) = v1 {
        let (root, point) = match mounts.iter().find(|m| m.version == CgroupVersion::V1) {
            Some(mount) => (mount.root.as_str(), mount.point.clone()),
            None => ("/", sys_root.join("fs/cgroup/memory")),
        };
        if point.is_dir() {
            return place(CgroupVersion::V1, &member.path, root, point);
        }
    }
    let member = memberships
        .iter()
        .find(|m| m.hierarchy == "0" && m.controllers.is_empty())?;
    let probed = [
        sys_root.join("fs/cgroup/unified"),
        sys_root.join("fs/cgroup"),
    ];
    let (root, point) = match mounts.iter().find(|m| m.version == CgroupVersion::V2) {
        Some(mount) => (mount.root.as_str(), mount.point.clone()),
        None => (
            "/",
            probed
                .into_iter()
                .find(|p| p.join("cgroup.controllers").is_file())?,
        ),
    };
    let controllers = std::fs::read_to_string(point.join("cgroup.controllers")).ok()?;
    if !controllers.split_whitespace().any(|c| c == "memory") {
        return None;
    }
    place(CgroupVersion::V2, &member.path, root, point)
}

/// The directory of cgroup `path` in a mount that shows `root` of the
/// hierarchy at `point`. A path outside the mount's root (another
/// namespace's view) is taken relative to the mount; `..` is refused.
fn place(version: CgroupVersion, path: &str, root: &str, point: PathBuf) -> Option<Place> {
    let relative = Path::new(path)
        .strip_prefix(root)
        .unwrap_or_else(|_| Path::new(path));
    let mut dir = point.clone();
    for component in relative.components() {
        match component {
            Component::Normal(part) => dir.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(Place {
        version,
        dir,
        top: point,
    })
}

/// Limit and usage file names of a version.
fn files(version: CgroupVersion) -> (&'static str, &'static str) {
    match version {
        CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        CgroupVersion::V2 => ("memory.max", "memory.current"),
    }
}

/// The smallest limit from `place.dir` up to `place.top`, with the usage of
/// the cgroup that sets it; `None` when all are unlimited or absent.
fn tightest_limit(place: &Place) -> Result<Option<MemoryLimit>, WarmError> {
    let (limit_name, usage_name) = files(place.version);
    let mut best: Option<(u64, PathBuf)> = None;
    let mut dir = place.dir.as_path();
    loop {
        let file = dir.join(limit_name);
        if let Some(limit) = read_limit(&file, place.version)? {
            if best.as_ref().is_none_or(|(b, _)| limit < *b) {
                best = Some((limit, dir.to_path_buf()));
            }
        }
        if dir == place.top {
            break;
        }
        match dir.parent() {
            Some(parent) if parent.starts_with(&place.top) => dir = parent,
            _ => break,
        }
    }
    let Some((limit, dir)) = best else {
        return Ok(None);
    };
    let usage = read_number(&dir.join(usage_name))?;
    let version = match place.version {
        CgroupVersion::V1 => "v1",
        CgroupVersion::V2 => "v2",
    };
    Ok(Some(MemoryLimit {
        source: format!("cgroup {version} {}", dir.join(limit_name).display()),
        limit,
        usage,
    }))
}

/// A limit file: `None` for "unlimited" or a missing file.
fn read_limit(file: &Path, version: CgroupVersion) -> Result<Option<u64>, WarmError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WarmError::io(file)(e)),
    };
    let text = text.trim();
    if version == CgroupVersion::V2 && text == "max" {
        return Ok(None);
    }
    let value = parse_bytes(text, file)?;
    Ok((version == CgroupVersion::V2 || value < V1_UNLIMITED).then_some(value))
}

fn read_number(file: &Path) -> Result<u64, WarmError> {
    let text = std::fs::read_to_string(file).map_err(WarmError::io(file))?;
    parse_bytes(text.trim(), file)
}

fn parse_bytes(text: &str, file: &Path) -> Result<u64, WarmError> {
    text.parse::<u64>()
        .map_err(|_| invalid(file, format!("{text:?} is not a byte count")))
}

/// Limit `MemTotal`, usage `MemTotal - MemAvailable` (`MemFree` on kernels
/// without `MemAvailable`).
fn read_meminfo(file: &Path) -> Result<MemoryLimit, WarmError> {
    let text = std::fs::read_to_string(file).map_err(WarmError::io(file))?;
    let field = |name: &str| -> Result<Option<u64>, WarmError> {
        let Some(line) = text.lines().find(|l| l.split(':').next() == Some(name)) else {
            return Ok(None);
        };
        let value = line.split(':').nth(1).unwrap_or("").trim();
        let number = value.strip_suffix("kB").unwrap_or(value).trim();
        number
            .parse::<u64>()
            .map(|kb| Some(kb.saturating_mul(1024)))
            .map_err(|_| invalid(file, format!("{name}: {value:?} is not a kB count")))
    };
    let Some(total) = field("MemTotal")? else {
        return Err(invalid(file, "no MemTotal line".to_string()));
    };
    let available = match field("MemAvailable")? {
        Some(a) => a,
        None => field("MemFree")?.unwrap_or(0),
    };
    Ok(MemoryLimit {
        source: format!("meminfo {}", file.display()),
        limit: total,
        usage: total.saturating_sub(available),
    })
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
/// Errors: [`WarmError::Config`] for a name that is empty, `.`, `..` or has
/// a `/`; [`WarmError::Unsupported`] when neither hierarchy has the memory
/// controller; [`WarmError::Io`] naming the directory or file otherwise
/// (no permission, a cgroup of that name already exists).
pub fn create_cgroup(name: &str, limit: Option<u64>) -> Result<Cgroup, WarmError> {
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
            return create_cgroup_at(CgroupVersion::V2, &point, name, limit);
        }
    }
    let v1 = mounts
        .iter()
        .find(|m| m.version == CgroupVersion::V1 && m.root == "/")
        .map(|m| m.point.clone())
        .unwrap_or_else(|| sys_root.join("fs/cgroup/memory"));
    if v1.join("memory.limit_in_bytes").is_file() {
        return create_cgroup_at(CgroupVersion::V1, &v1, name, limit);
    }
    Err(WarmError::Unsupported {
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
) -> Result<Cgroup, WarmError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(WarmError::Config(format!(
            "cgroup name {name:?}: must be one non-empty path component"
        )));
    }
    let path = parent.join(name);
    std::fs::create_dir(&path).map_err(WarmError::io(&path))?;
    let cgroup = Cgroup { version, path };
    if let Some(bytes) = limit {
        let file = cgroup.path.join(files(version).0);
        if let Err(e) = std::fs::write(&file, bytes.to_string()) {
            let _ = std::fs::remove_dir(&cgroup.path);
            return Err(WarmError::io(&file)(e));
        }
    }
    Ok(cgroup)
}

impl Cgroup {
    /// Moves process `pid` (all its threads) into this cgroup.
    pub fn add_pid(&self, pid: i32) -> Result<(), WarmError> {
        let file = self.path.join("cgroup.procs");
        std::fs::write(&file, pid.to_string()).map_err(WarmError::io(&file))
    }

    /// Bytes charged to this cgroup now (`memory.current` /
    /// `memory.usage_in_bytes`).
    pub fn usage(&self) -> Result<u64, WarmError> {
        read_number(&self.path.join(files(self.version).1))
    }

    /// This cgroup's own limit, `None` when unlimited.
    pub fn limit(&self) -> Result<Option<u64>, WarmError> {
        let file = self.path.join(files(self.version).0);
        match read_limit(&file, self.version)? {
            Some(limit) => Ok(Some(limit)),
            None if file.exists() => Ok(None),
            None => Err(WarmError::io(&file)(std::io::ErrorKind::NotFound.into())),
        }
    }

    /// Removes the cgroup (`rmdir`). Processes are not moved out: with any
    /// left inside this fails (`EBUSY`), naming the directory.
    pub fn remove(self) -> Result<(), WarmError> {
        std::fs::remove_dir(&self.path).map_err(WarmError::io(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const MEMINFO: &str = "MemTotal:       24000000 kB\nMemFree:  1000 kB\n\
                           MemAvailable:   20000000 kB\n";

    /// A fake `/proc` and `/sys`: returns (proc_root, sys_root).
    fn tree(dir: &Path, cgroup: &str, mountinfo: Option<&str>) -> (PathBuf, PathBuf) {
        let (proc_root, sys_root) = (dir.join("proc"), dir.join("sys"));
        std::fs::create_dir_all(proc_root.join("self")).unwrap();
        std::fs::create_dir_all(proc_root.join("42")).unwrap();
        std::fs::create_dir_all(&sys_root).unwrap();
        std::fs::write(proc_root.join("self/cgroup"), cgroup).unwrap();
        std::fs::write(proc_root.join("42/cgroup"), cgroup).unwrap();
        std::fs::write(proc_root.join("meminfo"), MEMINFO).unwrap();
        if let Some(text) = mountinfo {
            std::fs::write(proc_root.join("self/mountinfo"), text).unwrap();
        }
        (proc_root, sys_root)
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    const V1_MOUNTINFO: &str = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup \
                                rw,memory\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 \
                                cgroup2 rw\n";

    #[test]
    fn v1_limit_and_usage_of_own_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "4:memory:/job/a\n0::/\n", Some(V1_MOUNTINFO));
        let mem = s.join("fs/cgroup/memory");
        write(&mem.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(
            &mem.join("job/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        write(&mem.join("job/a/memory.limit_in_bytes"), "536870912\n");
        write(&mem.join("job/a/memory.usage_in_bytes"), "1048576\n");
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert_eq!((m.limit, m.usage), (512 * MIB, MIB));
        assert!(m.source.starts_with("cgroup v1 "), "{}", m.source);
        assert!(
            m.source.ends_with("job/a/memory.limit_in_bytes"),
            "{}",
            m.source
        );
        assert_eq!(memory_limit_in(&p, &s, Some(42)).unwrap(), m);
    }

    #[test]
    fn v2_limit_found_by_probing_without_mountinfo() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "0::/svc/job\n", None);
        let unified = s.join("fs/cgroup/unified");
        write(&unified.join("cgroup.controllers"), "cpu io memory pids\n");
        write(&unified.join("svc/job/memory.max"), "268435456\n");
        write(&unified.join("svc/job/memory.current"), "4096\n");
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert_eq!((m.limit, m.usage), (256 * MIB, 4096));
        assert!(m.source.starts_with("cgroup v2 "), "{}", m.source);
    }

    #[test]
    fn unlimited_child_takes_the_parents_limit_and_tighter_parent_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mountinfo = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let (p, s) = tree(dir.path(), "0::/a/b/c\n", Some(mountinfo));
        let root = s.join("fs/cgroup");
        write(&root.join("cgroup.controllers"), "memory\n");
        write(&root.join("a/memory.max"), "1073741824\n");
        write(&root.join("a/memory.current"), "7\n");
        write(&root.join("a/b/memory.max"), "max\n");
        write(&root.join("a/b/c/memory.max"), "max\n");
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert_eq!((m.limit, m.usage), (1 << 30, 7));
        assert!(m.source.ends_with("/a/memory.max"), "{}", m.source);
        // A child limit above its parent's does not loosen it.
        write(&root.join("a/b/c/memory.max"), "2147483648\n");
        assert_eq!(memory_limit_in(&p, &s, None).unwrap().limit, 1 << 30);
        write(&root.join("a/b/c/memory.max"), "1048576\n");
        write(&root.join("a/b/c/memory.current"), "5\n");
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert_eq!((m.limit, m.usage), (MIB, 5));
    }

    #[test]
    fn no_cgroup_limit_falls_back_to_meminfo() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "4:memory:/\n0::/\n", Some(V1_MOUNTINFO));
        write(
            &s.join("fs/cgroup/memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert_eq!(m.limit, 24_000_000 * 1024);
        assert_eq!(m.usage, 4_000_000 * 1024);
        assert!(m.source.starts_with("meminfo "), "{}", m.source);
        // No memory controller anywhere: meminfo too.
        let (p, s) = tree(&dir.path().join("b"), "1:cpu:/\n", None);
        assert!(memory_limit_in(&p, &s, None)
            .unwrap()
            .source
            .starts_with("meminfo "));
        // A v2 hierarchy without the memory controller does not count.
        let (p, s) = tree(&dir.path().join("c"), "0::/x\n", None);
        write(&s.join("fs/cgroup/unified/cgroup.controllers"), "hugetlb\n");
        write(&s.join("fs/cgroup/unified/x/memory.max"), "4096\n");
        assert!(memory_limit_in(&p, &s, None)
            .unwrap()
            .source
            .starts_with("meminfo "));
    }

    #[test]
    fn limit_above_the_machine_reports_the_machine() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "4:memory:/big\n", Some(V1_MOUNTINFO));
        write(
            &s.join("fs/cgroup/memory/big/memory.limit_in_bytes"),
            &(1u64 << 40).to_string(),
        );
        write(&s.join("fs/cgroup/memory/big/memory.usage_in_bytes"), "1\n");
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert!(m.source.starts_with("meminfo "), "{}", m.source);
    }

    fn expect_invalid(result: Result<MemoryLimit, WarmError>, file: &str) {
        match result {
            Err(WarmError::Io { path, source }) => {
                assert!(path.ends_with(file), "{} vs {file}", path.display());
                assert_eq!(source.kind(), std::io::ErrorKind::InvalidData, "{source}");
            }
            other => panic!("expected InvalidData naming {file}, got {other:?}"),
        }
    }

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
    fn garbage_files_are_typed_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "nonsense\n", Some(V1_MOUNTINFO));
        expect_invalid(memory_limit_in(&p, &s, None), "self/cgroup");

        let (p, s) = tree(&dir.path().join("b"), "4:memory:/j\n", Some(V1_MOUNTINFO));
        let job = s.join("fs/cgroup/memory/j");
        write(&job.join("memory.limit_in_bytes"), "lots\n");
        expect_invalid(memory_limit_in(&p, &s, None), "j/memory.limit_in_bytes");
        write(&job.join("memory.limit_in_bytes"), "4096\n");
        write(&job.join("memory.usage_in_bytes"), "-3\n");
        expect_invalid(memory_limit_in(&p, &s, None), "j/memory.usage_in_bytes");

        let (p, s) = tree(&dir.path().join("c"), "1:cpu:/\n", None);
        write(&p.join("meminfo"), "MemTotal: many kB\n");
        expect_invalid(memory_limit_in(&p, &s, None), "meminfo");

        let (p, s) = tree(&dir.path().join("d"), "1:cpu:/\n", None);
        match memory_limit_in(&p, &s, Some(7)) {
            Err(WarmError::Io { path, .. }) => assert!(path.ends_with("7/cgroup")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parent_dir_in_cgroup_path_does_not_escape_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "4:memory:/../../etc\n", Some(V1_MOUNTINFO));
        std::fs::create_dir_all(s.join("fs/cgroup/memory")).unwrap();
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert!(m.source.starts_with("meminfo "), "{}", m.source);
    }

    #[test]
    fn mountinfo_escapes_and_mount_roots() {
        let text = "1 0 0:1 /job /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory\n\
                    2 0 0:2 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                    3 0 0:3 / /proc rw - proc proc rw\n";
        let mounts = parse_mountinfo(text, Path::new("/fake"));
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].point, Path::new("/fake/fs/cgroup/my mem"));
        assert_eq!(mounts[0].root, "/job");
        let place = place(CgroupVersion::V1, "/job/a", "/job", mounts[0].point.clone()).unwrap();
        assert_eq!(place.dir, Path::new("/fake/fs/cgroup/my mem/a"));
    }

    #[test]
    fn watermark_over_and_headroom() {
        let m = MemoryLimit {
            source: "test".into(),
            limit: 1000,
            usage: 700,
        };
        let w = Watermark::default();
        assert!(!w.over(&m));
        assert_eq!(w.headroom(&m), 100);
        let full = MemoryLimit { usage: 800, ..m };
        assert!(w.over(&full));
        assert_eq!(w.headroom(&full), 0);
        assert!(Watermark::new(0.0).is_err());
        assert!(Watermark::new(1.5).is_err());
        assert!(Watermark::new(f64::NAN).is_err());
        assert_eq!(Watermark::new(0.5).unwrap().headroom(&full), 0);
    }

    #[test]
    fn own_limit_on_this_machine_is_sane() {
        let m = own_cgroup_memory_limit().unwrap();
        assert!(m.limit > 0 && m.usage <= m.limit.saturating_mul(2), "{m:?}");
        assert!(!m.source.is_empty());
    }

    #[test]
    fn fake_cgroup_create_add_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(
                create_cgroup_at(CgroupVersion::V2, dir.path(), bad, None),
                Err(WarmError::Config(_))
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
            Err(WarmError::Io { path, .. }) => assert!(path.ends_with("w/memory.current")),
            other => panic!("{other:?}"),
        }
        // Same name twice: an error naming the directory.
        match create_cgroup_at(CgroupVersion::V2, dir.path(), "w", None) {
            Err(WarmError::Io { path, .. }) => assert_eq!(path, dir.path().join("w")),
            other => panic!("{other:?}"),
        }
        // A plain directory with files is not empty: rmdir fails, named.
        match cg.clone().remove() {
            Err(WarmError::Io { path, .. }) => assert_eq!(path, dir.path().join("w")),
            other => panic!("{other:?}"),
        }
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
            Err(e @ WarmError::Unsupported { .. }) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(WarmError::Io { path, source })
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
        cg.remove().unwrap();
        assert!(!path.exists(), "{} still there", path.display());
        assert_eq!(checks.0.unwrap(), Some(64 * MIB));
        assert!(checks.1.unwrap() < MIB);
    }
}
