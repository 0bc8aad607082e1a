//! Accelerator → NUMA node, and binding a prefetch thread to a node.
//!
//! Page-cache folios are allocated on the node of the thread that first
//! reads or faults them, following that thread's memory policy; the VMA
//! policy of a shared file mapping (`mbind`) is ignored. So a prefetch
//! thread working for accelerator `k` calls [`bind_thread_to_node`] with
//! `NumaMap::node_of(k)` before touching its chunk, and the weights land
//! next to the PCIe root of the accelerator that will copy them. Pages
//! already cached on another node stay where they are.
//!
//! [`NumaMap::detect`] reads PCI sysfs: every function of class display
//! (`0x03xxxx`) or processing accelerator (`0x12xxxx`) from NVIDIA
//! (`0x10de`) or AMD (`0x1002`), in PCI address order, which is the order
//! `CUDA_DEVICE_ORDER=PCI_BUS_ID` and ROCm number them. Other vendors' VGA
//! functions (a server's BMC, an integrated GPU) and the GPUs' own audio or
//! bridge functions are left out, since the runtimes do not count them and
//! counting them would shift every index. `numa_node` -1 (no affinity
//! reported) is node 0. `SLUICE_NUMA_MAP=0:0,1:0,2:1,3:1` overrides
//! detection (accelerator:node), for tests and for machines whose firmware
//! reports nothing.

use std::collections::BTreeMap;
use std::path::Path;

use crate::os_error::OsError;

/// Environment variable overriding [`NumaMap::detect`].
pub const NUMA_MAP_ENV: &str = "SLUICE_NUMA_MAP";

/// Highest node count Linux supports (`NODES_SHIFT` 10); larger nodes are
/// refused before building a mask for them.
const MAX_NUMA_NODES: u32 = 1024;

/// PCI vendors whose display and accelerator functions count.
const ACCELERATOR_VENDORS: [u32; 2] = [0x10de, 0x1002];

/// PCI base classes that count: display controller, processing accelerator.
const ACCELERATOR_CLASSES: [u32; 2] = [0x03, 0x12];

/// Which NUMA node each accelerator is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaMap {
    /// Node of each accelerator index.
    node_by_accelerator: BTreeMap<u32, u32>,
    /// Online NUMA nodes (at least 1).
    nodes: u32,
}

impl NumaMap {
    /// The map of this machine: `spec` (the caller's `SLUICE_NUMA_MAP`,
    /// read with the rest of its environment) when given and valid
    /// (logged), else PCI sysfs under `/sys`. A malformed override is
    /// logged and ignored.
    pub fn detect(spec: Option<&str>) -> NumaMap {
        let from_sysfs = NumaMap::detect_in(Path::new("/sys"));
        let Some(spec) = spec else {
            return from_sysfs;
        };
        match NumaMap::from_spec(spec) {
            Ok(map) => {
                tracing::info!("{NUMA_MAP_ENV}={spec}: accelerator NUMA map overridden");
                NumaMap {
                    nodes: map.nodes.max(from_sysfs.nodes),
                    ..map
                }
            }
            Err(e) => {
                tracing::warn!("{NUMA_MAP_ENV} ignored: {e}");
                from_sysfs
            }
        }
    }

    /// The map read from a sysfs root: `/sys`, or a fake tree in tests.
    /// Unreadable entries are skipped; nothing found gives an empty map on
    /// one node.
    pub fn detect_in(sys_root: &Path) -> NumaMap {
        let devices = sys_root.join("bus/pci/devices");
        let mut addresses: Vec<_> = std::fs::read_dir(&devices)
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        // Fixed-width lowercase hex (dddd:bb:dd.f) sorts as the numbers do.
        addresses.sort();
        let mut node_by_accelerator = BTreeMap::new();
        for address in addresses {
            let dir = devices.join(&address);
            if !is_accelerator(&dir) {
                continue;
            }
            let node = std::fs::read_to_string(dir.join("numa_node"))
                .ok()
                .and_then(|t| t.trim().parse::<i64>().ok())
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0);
            let index = node_by_accelerator.len() as u32;
            tracing::debug!("accelerator {index}: {} on node {node}", dir.display());
            node_by_accelerator.insert(index, node);
        }
        let online = sys_root.join("devices/system/node/online");
        let nodes = std::fs::read_to_string(&online)
            .ok()
            .and_then(|t| count_node_list(t.trim()))
            .unwrap_or(1);
        NumaMap {
            node_by_accelerator,
            nodes,
        }
    }

    /// A map from `accelerator:node` pairs separated by commas
    /// (`0:0,1:0,2:1,3:1`). Node count is the highest node plus one.
    ///
    /// Errors: [`OsError::InvalidArgument`] naming the spec and the entry for an
    /// empty spec, a malformed or out-of-range entry, or an accelerator
    /// given twice.
    pub fn from_spec(spec: &str) -> Result<NumaMap, OsError> {
        let bad = |entry: &str, why: &str| OsError::InvalidArgument {
            what: format!("{NUMA_MAP_ENV} {spec:?}: entry"),
            value: format!("{entry:?}: {why}"),
            expected: "want accelerator:node,...",
        };
        if spec.trim().is_empty() {
            return Err(bad("", "empty"));
        }
        let mut node_by_accelerator = BTreeMap::new();
        for entry in spec.split(',') {
            let entry = entry.trim();
            let Some((accelerator, node)) = entry.split_once(':') else {
                return Err(bad(entry, "no ':'"));
            };
            let accelerator: u32 = accelerator
                .trim()
                .parse()
                .map_err(|_| bad(entry, "accelerator is not a number"))?;
            let node: u32 = node
                .trim()
                .parse()
                .map_err(|_| bad(entry, "node is not a number"))?;
            if node >= MAX_NUMA_NODES {
                return Err(bad(entry, "node beyond Linux's 1024"));
            }
            if node_by_accelerator.insert(accelerator, node).is_some() {
                return Err(bad(entry, "accelerator given twice"));
            }
        }
        let nodes = node_by_accelerator.values().max().map_or(1, |n| n + 1);
        Ok(NumaMap {
            node_by_accelerator,
            nodes,
        })
    }

    /// The node of accelerator `accelerator`, `None` when unknown.
    pub fn node_of(&self, accelerator: u32) -> Option<u32> {
        self.node_by_accelerator.get(&accelerator).copied()
    }

    /// Number of accelerators in the map.
    pub fn accelerators(&self) -> u32 {
        self.node_by_accelerator.len() as u32
    }

    /// Number of online NUMA nodes (from
    /// `/sys/devices/system/node/online`; 1 when unknown).
    pub fn nodes(&self) -> u32 {
        self.nodes
    }
}

/// Whether the PCI function in `dir` is an accelerator (module doc).
fn is_accelerator(dir: &Path) -> bool {
    let hex = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|t| u32::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok())
    };
    let (Some(vendor), Some(class)) = (hex("vendor"), hex("class")) else {
        return false;
    };
    ACCELERATOR_VENDORS.contains(&vendor) && ACCELERATOR_CLASSES.contains(&(class >> 16))
}

/// Number of nodes in a kernel node list (`0`, `0-3`, `0-1,4`); `None` when
/// malformed or empty.
fn count_node_list(list: &str) -> Option<u32> {
    parse_id_list(list).map(|ids| ids.len() as u32)
}

/// Makes the calling thread prefer memory on `node`
/// (`set_mempolicy(MPOL_PREFERRED)`): page-cache pages it reads in land
/// there while the node has free memory, elsewhere otherwise.
///
/// Errors: [`OsError::InvalidArgument`] for a node beyond Linux's 1024;
/// [`OsError::Unsupported`] when the kernel has no NUMA support
/// (`ENOSYS`), the node is not online (`EINVAL`), or a sandbox forbids the
/// call (`EPERM`).
pub fn bind_thread_to_node(node: u32) -> Result<(), OsError> {
    if node >= MAX_NUMA_NODES {
        return Err(OsError::InvalidArgument {
            what: "NUMA node".into(),
            value: node.to_string(),
            expected: "Linux supports at most 1024 nodes",
        });
    }
    let bits = libc::c_ulong::BITS;
    let mut mask = vec![0 as libc::c_ulong; (node / bits) as usize + 1];
    mask[(node / bits) as usize] |= 1 << (node % bits);
    // The kernel reads `maxnode - 1` bits; pass one more than the mask holds,
    // as libnuma does.
    let max_node = (mask.len() as libc::c_ulong) * libc::c_ulong::from(bits) + 1;
    // SAFETY: the kernel reads `max_node - 1` bits from `mask`, which holds
    // that many; the call changes only this thread's policy.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            libc::MPOL_PREFERRED,
            mask.as_ptr(),
            max_node,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    let reason = match err.raw_os_error() {
        Some(libc::ENOSYS) => "kernel without NUMA support".to_string(),
        Some(libc::EINVAL) => format!("node {node} is not online"),
        Some(libc::EPERM) => format!("node {node}: not permitted here: {err}"),
        _ => format!("node {node}: {err}"),
    };
    Err(OsError::Unsupported {
        feature: "set_mempolicy",
        reason,
    })
}

/// Runs the calling thread on the CPUs of `node` (its
/// `/sys/devices/system/node/nodeN/cpulist`), so the reads it issues and
/// the pages it allocates stay next to that node's memory controller.
///
/// Errors: [`OsError::Io`] naming the cpulist file when it cannot be
/// read (no such node, no sysfs); [`OsError::InvalidArgument`] naming it when it
/// is malformed or empty; [`OsError::Unsupported`] when
/// `sched_setaffinity` refuses (a container's cpuset excludes them all).
pub fn pin_thread_to_node_cpus(node: u32) -> Result<(), OsError> {
    let list = std::path::PathBuf::from(format!("/sys/devices/system/node/node{node}/cpulist"));
    let text = std::fs::read_to_string(&list).map_err(OsError::io(&list))?;
    let cpus = parse_id_list(text.trim()).ok_or_else(|| OsError::InvalidArgument {
        what: list.display().to_string(),
        value: format!("{:?}", text.trim()),
        expected: "a CPU list like 0-3,8",
    })?;
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let capacity = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for cpu in cpus.into_iter().filter(|&c| (c as usize) < capacity) {
        // SAFETY: `cpu` is below the set's capacity.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    }
    // SAFETY: the set outlives the call; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        return Ok(());
    }
    Err(OsError::Unsupported {
        feature: "sched_setaffinity",
        reason: format!("node {node}: {}", std::io::Error::last_os_error()),
    })
}

/// The ids of a kernel CPU or node list (`0-3,8,10-11`); `None` when
/// malformed or empty.
fn parse_id_list(list: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if hi < lo || hi - lo >= 1 << 16 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_id_list("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_id_list("5"), Some(vec![5]));
        for bad in ["", "3-1", "a", "0-", "0,,1", "0-99999999"] {
            assert_eq!(parse_id_list(bad), None, "{bad:?}");
        }
        match pin_thread_to_node_cpus(MAX_NUMA_NODES + 7) {
            Err(OsError::Io { path, .. }) => {
                assert!(path.to_string_lossy().contains("node1031"), "{path:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn spec_parses_pairs_and_counts_nodes() {
        let map = NumaMap::from_spec("0:0, 1:0,2:1,3:1").unwrap();
        assert_eq!(map.node_of(0), Some(0));
        assert_eq!(map.node_of(2), Some(1));
        assert_eq!(map.node_of(3), Some(1));
        assert_eq!(map.node_of(4), None);
        assert_eq!(map.accelerators(), 4);
        assert_eq!(map.nodes(), 2);
    }

    #[test]
    fn bad_specs_are_config_errors_naming_the_entry() {
        for (spec, entry) in [
            ("", "\"\""),
            ("0:0,,1:1", "\"\""),
            ("0-0", "\"0-0\""),
            ("a:0", "\"a:0\""),
            ("0:b", "\"0:b\""),
            ("0:-1", "\"0:-1\""),
            ("0:0,0:1", "\"0:1\""),
            ("0:5000", "\"0:5000\""),
        ] {
            match NumaMap::from_spec(spec) {
                Err(e @ OsError::InvalidArgument { .. }) => {
                    let m = e.to_string();
                    assert!(m.contains(entry), "{spec}: {m}")
                }
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    fn device(root: &Path, address: &str, vendor: &str, class: &str, node: Option<&str>) {
        let dir = root.join("bus/pci/devices").join(address);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        if let Some(node) = node {
            std::fs::write(dir.join("numa_node"), format!("{node}\n")).unwrap();
        }
    }

    #[test]
    fn detect_orders_gpus_by_pci_address_and_skips_others() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // Written out of order; read_dir order must not matter.
        device(r, "0000:c1:00.0", "0x10de", "0x030200", Some("1"));
        device(r, "0000:41:00.0", "0x10de", "0x030200", Some("0"));
        device(r, "0000:41:00.1", "0x10de", "0x040300", Some("0")); // HDMI audio
        device(r, "0000:02:00.0", "0x1a03", "0x030000", Some("0")); // BMC VGA
        device(r, "0000:81:00.0", "0x1002", "0x120000", Some("-1")); // MI300, no affinity
        device(r, "0000:e1:00.0", "0x10de", "0x030200", None);
        device(r, "0000:f1:00.0", "0x8086", "0x010802", Some("1")); // NVMe
        std::fs::create_dir_all(r.join("devices/system/node")).unwrap();
        std::fs::write(r.join("devices/system/node/online"), "0-1\n").unwrap();
        let map = NumaMap::detect_in(r);
        assert_eq!(map.accelerators(), 4);
        assert_eq!(
            (0..4).map(|k| map.node_of(k)).collect::<Vec<_>>(),
            [Some(0), Some(0), Some(1), Some(0)]
        );
        assert_eq!(map.nodes(), 2);
    }

    #[test]
    fn detect_on_an_empty_tree_is_one_node_no_accelerators() {
        let root = tempfile::tempdir().unwrap();
        let map = NumaMap::detect_in(root.path());
        assert_eq!((map.accelerators(), map.nodes()), (0, 1));
        std::fs::create_dir_all(root.path().join("devices/system/node")).unwrap();
        std::fs::write(root.path().join("devices/system/node/online"), "x\n").unwrap();
        assert_eq!(NumaMap::detect_in(root.path()).nodes(), 1);
    }

    #[test]
    fn node_lists_count_ranges() {
        assert_eq!(count_node_list("0"), Some(1));
        assert_eq!(count_node_list("0-3"), Some(4));
        assert_eq!(count_node_list("0-1,4,6-7"), Some(5));
        assert_eq!(count_node_list("3-1"), None);
        assert_eq!(count_node_list(""), None);
        assert_eq!(count_node_list("0-4294967295"), None);
    }

    #[test]
    fn this_machine_has_at_least_one_node() {
        assert!(NumaMap::detect_in(Path::new("/sys")).nodes() >= 1);
    }

    #[test]
    fn bind_to_node_zero_works_and_absent_node_is_typed() {
        let results = std::thread::spawn(|| (bind_thread_to_node(0), bind_thread_to_node(7)))
            .join()
            .unwrap();
        match results.0 {
            Ok(()) => {}
            Err(OsError::Unsupported { reason, .. }) if reason.contains("not permitted") => {
                eprintln!("skipped: {reason}");
                return;
            }
            Err(e) => panic!("node 0: {e}"),
        }
        if NumaMap::detect_in(Path::new("/sys")).nodes() <= 7 {
            match results.1 {
                Err(OsError::Unsupported { reason, .. }) => {
                    assert!(reason.contains("node 7"), "{reason}")
                }
                other => panic!("node 7: {other:?}"),
            }
        }
        assert!(matches!(
            bind_thread_to_node(5000),
            Err(OsError::InvalidArgument { .. })
        ));
    }
}
