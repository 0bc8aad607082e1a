//! Where a process's memory cgroup is.
//!
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

use std::path::{Component, Path, PathBuf};

use super::{invalid, CgroupVersion};
use crate::os_error::OsError;

/// One line of `/proc/<pid>/cgroup`.
#[derive(Debug)]
pub(super) struct Membership {
    pub(super) hierarchy: String,
    pub(super) controllers: Vec<String>,
    pub(super) path: String,
}

pub(super) fn parse_proc_cgroup(text: &str, file: &Path) -> Result<Vec<Membership>, OsError> {
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
pub(super) struct CgroupMount {
    pub(super) version: CgroupVersion,
    /// Which part of the hierarchy the mount shows (`/` usually).
    pub(super) root: String,
    /// Where it is mounted, rebased under the sysfs root.
    pub(super) point: PathBuf,
}

pub(super) fn parse_mountinfo(text: &str, sys_root: &Path) -> Vec<CgroupMount> {
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
pub(super) fn unescape(field: &str) -> String {
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
pub(super) fn rebase(point: &Path, sys_root: &Path) -> PathBuf {
    match point.strip_prefix("/sys") {
        Ok(rest) => sys_root.join(rest),
        Err(_) => point.to_path_buf(),
    }
}

/// Where a process's memory cgroup is: its version, its directory and the
/// mount point above which the walk stops.
#[derive(Debug)]
pub(super) struct Place {
    pub(super) version: CgroupVersion,
    pub(super) dir: PathBuf,
    pub(super) top: PathBuf,
}

pub(super) fn locate(
    memberships: &[Membership],
    mounts: &[CgroupMount],
    sys_root: &Path,
) -> Option<Place> {
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
pub(super) fn place(
    version: CgroupVersion,
    path: &str,
    root: &str,
    point: PathBuf,
) -> Option<Place> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
