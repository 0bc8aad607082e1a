//! Which memory limit applies to a process, and a watermark over it.
//!
//! From the process's cgroup (see the `hierarchy` module) up to the mount
//! root, the tightest limit applies (a parent's limit caps its children):
//! v1 `memory.limit_in_bytes` (values ≥ 2^62 mean "unlimited": the kernel
//! writes `PAGE_COUNTER_MAX` pages there) with `memory.usage_in_bytes`, v2
//! `memory.max` (`max` = unlimited) with `memory.current`. Levels without
//! the files (the v2 root) are skipped. No limit, or one above the
//! machine's memory: `/proc/meminfo`, limit `MemTotal`, usage
//! `MemTotal - MemAvailable`.

use std::path::{Path, PathBuf};

use super::hierarchy::{locate, parse_mountinfo, parse_proc_cgroup, Place};
use super::{files, invalid, read_limit, read_number, CgroupVersion};
use crate::os_error::OsError;

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
    /// A watermark at `fraction` of the limit; [`OsError::InvalidArgument`] unless
    /// `0 < fraction <= 1`.
    pub fn new(fraction: f64) -> Result<Watermark, OsError> {
        if fraction > 0.0 && fraction <= 1.0 {
            Ok(Watermark { fraction })
        } else {
            Err(OsError::InvalidArgument {
                what: "memory watermark".into(),
                value: fraction.to_string(),
                expected: "must be in (0, 1]",
            })
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
pub fn own_cgroup_memory_limit() -> Result<MemoryLimit, OsError> {
    memory_limit_in(Path::new("/proc"), Path::new("/sys"), None)
}

/// The memory limit of process `pid`.
pub fn memory_limit_for_pid(pid: i32) -> Result<MemoryLimit, OsError> {
    memory_limit_in(Path::new("/proc"), Path::new("/sys"), Some(pid))
}

/// The memory limit of `pid` (or the caller) under a procfs and a sysfs
/// root: the algorithm of the module doc. Mount points under `/sys` in
/// mountinfo are read under `sys_root`, so a fake tree works as a test.
///
/// Errors: [`OsError::Io`] naming the file when `<pid>/cgroup` cannot be
/// read (for `Some(pid)`), or when a cgroup or meminfo file is garbage
/// (`InvalidData`, with the text).
pub fn memory_limit_in(
    proc_root: &Path,
    sys_root: &Path,
    pid: Option<i32>,
) -> Result<MemoryLimit, OsError> {
    let who = pid.map_or_else(|| "self".to_string(), |p| p.to_string());
    let cgroup_file = proc_root.join(who).join("cgroup");
    let memberships = match std::fs::read_to_string(&cgroup_file) {
        Ok(text) => parse_proc_cgroup(&text, &cgroup_file)?,
        Err(e) if pid.is_none() && e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(OsError::io(&cgroup_file)(e)),
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

/// The smallest limit from `place.dir` up to `place.top`, with the usage of
/// the cgroup that sets it; `None` when all are unlimited or absent.
fn tightest_limit(place: &Place) -> Result<Option<MemoryLimit>, OsError> {
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

/// Limit `MemTotal`, usage `MemTotal - MemAvailable` (`MemFree` on kernels
/// without `MemAvailable`).
fn read_meminfo(file: &Path) -> Result<MemoryLimit, OsError> {
    let text = std::fs::read_to_string(file).map_err(OsError::io(file))?;
    let field = |name: &str| -> Result<Option<u64>, OsError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const V1_MOUNTINFO: &str = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup \
                                rw,memory\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 \
                                cgroup2 rw\n";
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

    fn expect_invalid(result: Result<MemoryLimit, OsError>, file: &str) {
        match result {
            Err(OsError::Io { path, source }) => {
                assert!(path.ends_with(file), "{} vs {file}", path.display());
                assert_eq!(source.kind(), std::io::ErrorKind::InvalidData, "{source}");
            }
            other => panic!("expected InvalidData naming {file}, got {other:?}"),
        }
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
            Err(OsError::Io { path, .. }) => assert!(path.ends_with("7/cgroup")),
            other => panic!("{other:?}"),
        }
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
    fn parent_dir_in_cgroup_path_does_not_escape_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let (p, s) = tree(dir.path(), "4:memory:/../../etc\n", Some(V1_MOUNTINFO));
        std::fs::create_dir_all(s.join("fs/cgroup/memory")).unwrap();
        let m = memory_limit_in(&p, &s, None).unwrap();
        assert!(m.source.starts_with("meminfo "), "{}", m.source);
    }
}
