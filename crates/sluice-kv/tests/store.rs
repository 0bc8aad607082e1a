//! The KV store end to end: tiers, prefix semantics, leases, budgets, recovery, bad input.

mod common;

use common::*;
use sluice_kv::{KvConfig, KvError, KvStore, WriteMode};
use sluice_policy::{Access, PolicyConfig, Request};
use sluice_testkit::mkfifo;

#[test]
fn blocks_round_trip_through_each_tier_layout() {
    for (dram, ssd) in [(16, 0), (0, 64), (4, 64)] {
        let dir = tempdir();
        let store = KvStore::open(dir.path(), config(dram, ssd)).unwrap();
        assert_eq!(
            put(&store, &[1, 2, 3]),
            vec![true; 3],
            "dram={dram} ssd={ssd}"
        );
        assert_eq!(lookup(&store, &[1, 2, 3, 4]), 3);
        assert_eq!(get(&store, &[1, 2, 3]), vec![true; 3]);
        assert_eq!(get(&store, &[9]), vec![false]);
    }
}

#[test]
fn a_second_put_of_a_key_keeps_the_first_bytes() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    put(&store, &[1]);
    let k = key(1);
    let other = vec![0xEEu8; BLOCK as usize];
    assert_eq!(store.put_batch(&[&k], &[&other]).unwrap(), vec![true]);
    assert_eq!(get(&store, &[1]), vec![true]); // still block_for(key(1))
}

#[test]
fn lookup_counts_consecutive_hits_from_the_start_only() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    put(&store, &[1, 2, 4, 5]);
    assert_eq!(lookup(&store, &[1, 2, 3, 4, 5]), 2);
    assert_eq!(lookup(&store, &[3, 1]), 0);
    assert_eq!(lookup(&store, &[]), 0);
}

#[test]
fn a_get_after_a_missing_key_is_a_miss_for_the_rest_of_the_chain() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    put(&store, &[1, 2, 4]);
    assert_eq!(get(&store, &[1, 2, 3, 4]), vec![true, true, false, false]);
}

#[test]
fn namespaces_never_see_each_others_blocks() {
    let dir = tempdir();
    {
        let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
        put(&store, &[1, 2]);
        store.close().unwrap();
    }
    let mut other = config(4, 64);
    other.namespace = ns("another-model");
    let store = KvStore::open(dir.path(), other).unwrap();
    assert_eq!(lookup(&store, &[1]), 0);
    assert_eq!(get(&store, &[1, 2]), vec![false, false]);
    // Its own blocks under the same keys are separate.
    put(&store, &[1]);
    assert_eq!(get(&store, &[1]), vec![true]);
}

#[test]
fn every_acknowledged_block_is_found_after_reopening() {
    let dir = tempdir();
    let cfg = config(4, 64);
    let fits = cfg.ssd_policy_capacity() / cfg.slot_bytes();
    let ids: Vec<u64> = (0..fits).collect();
    {
        let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
        assert!(put(&store, &ids).iter().all(|o| *o));
        // Dropped without close(): as if the process ended.
    }
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    assert_eq!(store.stats().recovered_blocks, fits);
    assert_eq!(lookup(&store, &ids), fits as usize);
    assert!(get(&store, &ids).iter().all(|o| *o));
}

#[test]
fn a_second_open_of_an_open_store_is_refused_naming_it() {
    let dir = tempdir();
    let first = KvStore::open(dir.path(), config(4, 64)).unwrap();
    let err = KvStore::open(dir.path(), config(4, 64)).err().unwrap();
    assert!(matches!(err, KvError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains(&std::process::id().to_string()),
        "{err}"
    );
    // Issue 27: the holder is this very process, not "another process".
    assert!(
        err.to_string().contains("this process already has it open"),
        "{err}"
    );
    first.close().unwrap();
    KvStore::open(dir.path(), config(4, 64)).unwrap();
}

#[test]
fn calls_after_close_fail_with_closed() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    store.close().unwrap();
    let k = key(1);
    assert!(matches!(store.lookup(&[&k], false), Err(KvError::Closed)));
}

/// This process's open descriptors on files under `dir`.
fn open_files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

#[test]
fn close_lets_go_of_every_file_while_the_store_is_still_referenced() {
    // Issue 27: a closed store kept its segment files open until the object was dropped,
    // so the file system under it could not be unmounted (`umount`: target is busy).
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    put(&store, &(0..32).collect::<Vec<u64>>());
    assert!(!open_files_under(dir.path()).is_empty());
    store.close().unwrap();
    assert_eq!(
        open_files_under(dir.path()),
        Vec::<std::path::PathBuf>::new()
    );
    drop(store);
    // Nothing was lost by letting go early.
    let store = KvStore::open(dir.path(), config(4, 64)).unwrap();
    assert_eq!(lookup(&store, &(0..32).collect::<Vec<u64>>()), 32);
}

#[test]
fn close_lets_go_of_the_files_that_leases_held() {
    // Issue 27: a lookup's lease holds its record's segment file until the get; a lookup
    // never followed by a get kept that file open past close(), and `umount` of the file
    // system under the store failed ("target is busy").
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    put(&store, &[1, 2]);
    drop(store);
    let store = KvStore::open(dir.path(), config(0, 64)).unwrap();
    let k = key(1);
    assert_eq!(store.lookup(&[&k], true).unwrap(), 1);
    store.close().unwrap();
    assert_eq!(
        open_files_under(dir.path()),
        Vec::<std::path::PathBuf>::new()
    );
}

#[test]
fn keys_and_buffers_of_the_wrong_size_are_refused_naming_the_value() {
    let dir = tempdir();
    let mut cfg = config(4, 64);
    cfg.key_bytes = Some(12);
    let store = KvStore::open(dir.path(), cfg).unwrap();
    let good = key(1); // 14 bytes
    let block = vec![0u8; BLOCK as usize];
    let err = store.put_batch(&[&good], &[&block]).unwrap_err();
    assert!(
        err.to_string().contains("key 0") && err.to_string().contains("12 bytes"),
        "{err}"
    );
    let k12 = b"twelve-bytes".to_vec();
    let short = vec![0u8; 100];
    let err = store.put_batch(&[&k12], &[&short]).unwrap_err();
    assert!(err.to_string().contains("buffer 0: 100 bytes"), "{err}");
    let err = store.put_batch(&[&k12, &k12], &[&block]).unwrap_err();
    assert!(err.to_string().contains("2 keys but 1 buffers"), "{err}");
    let err = store.lookup(&[b""], false).unwrap_err();
    assert!(matches!(err, KvError::InvalidArgument { .. }), "{err}");
    let huge = vec![1u8; 5000];
    assert!(store.lookup(&[&huge], false).is_err());
}

#[test]
fn bad_configurations_are_refused_naming_the_field() {
    let dir = tempdir();
    let cases: Vec<(KvConfig, &str)> = vec![
        (config(0, 0), "dram_bytes/ssd_bytes"),
        (
            KvConfig {
                block_bytes: 0,
                ..config(4, 64)
            },
            "block_bytes",
        ),
        (
            KvConfig {
                io_threads: 0,
                ..config(4, 64)
            },
            "io_threads",
        ),
        (
            KvConfig {
                ssd_bytes: 3 * BLOCK,
                ..config(0, 0)
            },
            "ssd_bytes",
        ),
        (
            KvConfig {
                high_watermark: 0.5,
                low_watermark: 0.7,
                ..config(4, 64)
            },
            "watermark",
        ),
        // Issue 27: a rank outside its tensor-parallel group was accepted.
        (
            KvConfig {
                namespace: sluice_kv::Namespace {
                    tp_rank: 5,
                    tp_size: 2,
                    ..ns("m")
                },
                ..config(4, 64)
            },
            "tp_rank",
        ),
    ];
    for (cfg, field) in cases {
        let err = KvStore::open(dir.path(), cfg).err().unwrap();
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    assert!(PolicyConfig::parse("no-such-policy").is_err());
}

#[test]
fn a_directory_that_is_not_a_store_is_refused_and_left_alone() {
    let dir = tempdir();
    std::fs::write(dir.path().join("precious.txt"), b"data").unwrap();
    let err = KvStore::open(dir.path(), config(4, 64)).err().unwrap();
    assert!(matches!(err, KvError::Incompatible { .. }), "{err}");
    assert_eq!(
        std::fs::read(dir.path().join("precious.txt")).unwrap(),
        b"data"
    );
}

#[test]
fn a_store_of_another_version_or_block_size_or_a_corrupt_manifest_is_refused() {
    let dir = tempdir();
    KvStore::open(dir.path(), config(4, 64))
        .unwrap()
        .close()
        .unwrap();
    let mut other = config(4, 64);
    other.block_bytes = 2 * BLOCK;
    let err = KvStore::open(dir.path(), other).err().unwrap();
    assert!(err.to_string().contains("8192-byte blocks"), "{err}");

    let manifest = dir.path().join("sluice-kv.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"version\": 1", "\"version\": 99")).unwrap();
    let err = KvStore::open(dir.path(), config(4, 64)).err().unwrap();
    assert!(err.to_string().contains("version 99"), "{err}");

    std::fs::write(&manifest, b"{not json").unwrap();
    let err = KvStore::open(dir.path(), config(4, 64)).err().unwrap();
    assert!(matches!(err, KvError::Incompatible { .. }), "{err}");
}

#[test]
fn a_segment_copied_from_another_store_is_refused() {
    let a = tempdir();
    let b = tempdir();
    let sa = KvStore::open(a.path(), config(0, 64)).unwrap();
    put(&sa, &[1]);
    sa.close().unwrap();
    KvStore::open(b.path(), config(0, 64))
        .unwrap()
        .close()
        .unwrap();
    let seg = std::fs::read_dir(a.path().join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "skv"))
        .unwrap();
    std::fs::copy(
        &seg,
        b.path().join("segments").join(seg.file_name().unwrap()),
    )
    .unwrap();
    let err = KvStore::open(b.path(), config(0, 64)).err().unwrap();
    assert!(err.to_string().contains("another store"), "{err}");
}

/// Segment files stay under the disk limit: the budget plus its documented overhead
/// (issue 27 #16: the budget counts blocks, the overhead is on top).
#[test]
fn ssd_segment_files_never_exceed_the_disk_limit() {
    let dir = tempdir();
    let cfg = config(0, 64);
    let budget = cfg.ssd_disk_bytes_limit();
    let store = KvStore::open(dir.path(), cfg).unwrap();
    for round in 0..20u64 {
        let ids: Vec<u64> = (round * 16..round * 16 + 16).collect();
        put(&store, &ids);
        // Segment files only; one the reclaim thread removes meanwhile is gone.
        let on_disk: u64 = std::fs::read_dir(dir.path().join("segments"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "skv"))
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        assert!(on_disk <= budget, "round {round}: {on_disk} > {budget}");
        let s = store.stats();
        let ssd = s.ssd.unwrap();
        assert!(ssd.allocated_bytes <= budget && ssd.used_bytes <= budget);
        assert_eq!(ssd.disk_bytes_limit, Some(budget));
    }
    // The newest blocks are there; everything found reads back exactly.
    assert_eq!(lookup(&store, &[319]), 1);
    let all: Vec<u64> = (0..320).collect();
    for id in all {
        get(&store, &[id]);
    }
    assert!(store.stats().segments_dropped + store.stats().segments_compacted > 0);
}

#[test]
fn dram_never_holds_more_blocks_than_its_slots() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(5, 0)).unwrap();
    for i in 0..50 {
        put(&store, &[i]);
        let d = store.stats().dram.unwrap();
        assert!(d.blocks <= 5 && d.used_bytes <= 5 * BLOCK);
    }
    assert_eq!(lookup(&store, &[49]), 1);
    assert_eq!(lookup(&store, &[0]), 0);
}

#[test]
fn a_leased_block_stays_readable_after_eviction() {
    let dir = tempdir();
    let store = KvStore::open(dir.path(), config(2, 0)).unwrap();
    put(&store, &[1]);
    let k1 = key(1);
    assert_eq!(store.lookup(&[&k1], true).unwrap(), 1);
    put(&store, &[2, 3, 4]); // evicts 1 from the 2-slot arena
    assert_eq!(lookup(&store, &[1]), 0);
    assert_eq!(get(&store, &[1]), vec![true]);
    // The lease ended with the get.
    assert_eq!(get(&store, &[1]), vec![false]);
}

#[test]
fn write_back_demotes_to_ssd_on_dram_eviction() {
    let dir = tempdir();
    // Two blocks: the policy keeps two (the arena's spare slot, for blocks evicted while
    // pinned, is on top of the budget).
    let mut cfg = config(2, 64);
    cfg.write_mode = WriteMode::WriteBack;
    let store = KvStore::open(dir.path(), cfg).unwrap();
    put(&store, &[1, 2]);
    assert_eq!(store.stats().ssd.unwrap().blocks, 0);
    put(&store, &[3, 4]);
    assert_eq!(store.stats().ssd.unwrap().blocks, 2);
    assert_eq!(get(&store, &[1, 2, 3, 4]), vec![true; 4]);
}

/// Issue 27: a write-back store let go of without `close()` (a script's last line, a
/// collected Python object) synced its segments but never wrote the blocks only DRAM held:
/// every put acknowledged since the last demotion was gone at reopen.
#[test]
fn a_write_back_store_dropped_without_close_keeps_what_it_acknowledged() {
    let dir = tempdir();
    let mut cfg = config(16, 64);
    cfg.write_mode = WriteMode::WriteBack;
    let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
    assert_eq!(put(&store, &[1, 2, 3]), vec![true; 3]);
    assert_eq!(store.stats().ssd.unwrap().blocks, 0, "only DRAM holds them");
    drop(store);
    let store = KvStore::open(dir.path(), cfg).unwrap();
    assert_eq!(get(&store, &[1, 2, 3]), vec![true; 3]);
}

/// The live store's SSD residency follows the policy exactly: a put is the policy's miss,
/// a get its hit, so the sequence of answers equals `sluice-policy`'s on the same keys.
#[test]
fn live_admissions_and_evictions_equal_the_policy_library() {
    for spec in ["lru", "fifo", "s3fifo", "arc", "sieve"] {
        let dir = tempdir();
        let mut cfg = config(0, 64);
        cfg.ssd_policy = PolicyConfig::parse(spec).unwrap();
        cfg.high_watermark = 1.0;
        cfg.low_watermark = 0.95;
        let slot = cfg.slot_bytes();
        let capacity = cfg.ssd_policy_capacity();
        let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
        let mut policy = cfg.ssd_policy.build(capacity).unwrap();
        let mut evicted = Vec::new();
        let mut rng = 12345u64;
        for step in 0..600 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = (rng >> 33) % 90;
            let want = policy.access(&Request::new(store_fp(&store, id), slot), &mut evicted);
            let live_hit = lookup(&store, &[id]) == 1;
            assert_eq!(
                live_hit,
                want == Access::Hit,
                "{spec}: step {step}, key {id}: {:?}",
                store.stats()
            );
            if live_hit {
                assert_eq!(get(&store, &[id]), vec![true]);
            } else {
                put(&store, &[id]);
            }
        }
    }
}

/// Two tiers, driven the way an engine (and `sluice kv bench`) drives them: per request,
/// lookup the chain, get the hit prefix, put the rest, in batches. Each tier's policy must
/// see exactly the accesses of a two-level cache model over `sluice-policy`: every block
/// goes to the DRAM policy; the ones DRAM does not hit go on to the SSD policy. That is
/// what `sluice kv bench --compare-sim` predicts, so the live hit counts must equal it.
#[test]
fn two_tiers_under_batched_requests_equal_a_two_level_policy_model() {
    for spec in ["lru", "s3fifo", "arc", "fifo"] {
        let dir = tempdir();
        let mut cfg = config(12, 64);
        cfg.dram_policy = PolicyConfig::parse(spec).unwrap();
        cfg.ssd_policy = PolicyConfig::parse(spec).unwrap();
        cfg.high_watermark = 1.0;
        cfg.low_watermark = 0.95;
        let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
        let mut dram = cfg
            .dram_policy
            .build(cfg.dram_policy_blocks() * BLOCK)
            .unwrap();
        let mut ssd = cfg.ssd_policy.build(cfg.ssd_policy_capacity()).unwrap();
        let slot = cfg.slot_bytes();
        let mut ev = Vec::new();
        let (mut want_dram, mut want_ssd) = (0u64, 0u64);
        let mut rng = 99u64;
        for request in 0..300 {
            // A chain: a shared root (one of 4), a branch (one of 12), then 0-3 fresh tails.
            let mut next = || {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                rng >> 33
            };
            let root = next() % 4;
            let branch = 100 + root * 12 + next() % 12;
            let mut chain = vec![root, branch, 1000 + branch * 10 + next() % 6];
            chain.extend((0..next() % 4).map(|t| 100_000 + request * 4 + t));
            // The model: residency before the request decides the lookup's prefix.
            let resident =
                |dram: &dyn sluice_policy::Policy, ssd: &dyn sluice_policy::Policy, id: u64| {
                    dram.contains(store_fp(&store, id)) || ssd.contains(store_fp(&store, id))
                };
            let n_model = chain
                .iter()
                .take_while(|id| resident(&*dram, &*ssd, **id))
                .count();
            for (i, id) in chain.iter().enumerate() {
                let fp = store_fp(&store, *id);
                if dram.access(&Request::new(fp, BLOCK), &mut ev) == Access::Hit {
                    want_dram += u64::from(i < n_model);
                    continue;
                }
                let hit = ssd.access(&Request::new(fp, slot), &mut ev) == Access::Hit;
                want_ssd += u64::from(hit && i < n_model);
            }
            ev.clear();
            let n = lookup(&store, &chain);
            assert_eq!(n, n_model, "{spec}: request {request}, chain {chain:?}");
            assert_eq!(get(&store, &chain[..n]), vec![true; n]);
            // A put is false when the policy evicts the block again before the batch
            // ends (s3fifo's small queue does): then it must not be found.
            for (id, ok) in chain[n..].iter().zip(put(&store, &chain[n..])) {
                assert_eq!(lookup(&store, &[*id]), usize::from(ok), "{spec}: {id}");
            }
            let st = store.stats();
            assert_eq!(
                (st.hits_dram, st.hits_ssd),
                (want_dram, want_ssd),
                "{spec}: request {request}"
            );
        }
        assert!(want_dram > 0 && want_ssd > 0, "{spec}: both tiers must hit");
    }
}

fn store_fp(store: &KvStore, id: u64) -> u64 {
    sluice_kv::Fingerprint::of(&store.config().namespace.id(), &key(id)).0
}

#[test]
fn fifos_and_files_in_the_stores_places_are_refused_or_skipped_without_hanging() {
    // A file where the store directory should be.
    let dir = tempdir();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let err = KvStore::open(&file, config(0, 64)).err().unwrap();
    assert!(err.to_string().contains("is not a directory"), "{err}");

    // A FIFO in place of the manifest.
    let store_dir = dir.path().join("store");
    KvStore::open(&store_dir, config(0, 64))
        .unwrap()
        .close()
        .unwrap();
    let manifest = store_dir.join("sluice-kv.json");
    let saved = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    mkfifo(&manifest);
    let err = KvStore::open(&store_dir, config(0, 64)).err().unwrap();
    assert!(err.to_string().contains("FIFO"), "{err}");
    std::fs::remove_file(&manifest).unwrap();
    std::fs::write(&manifest, saved).unwrap();

    // A FIFO named like a segment is skipped and left alone; real blocks still load.
    let store = KvStore::open(&store_dir, config(0, 64)).unwrap();
    put(&store, &[1]);
    store.close().unwrap();
    drop(store);
    let fake = store_dir
        .join("segments")
        .join(format!("seg-{:016x}.skv", 99));
    mkfifo(&fake);
    let store = KvStore::open(&store_dir, config(0, 64)).unwrap();
    assert_eq!(get(&store, &[1]), vec![true]);
    assert!(fake.exists());
}

#[test]
fn a_store_path_of_the_wrong_kind_is_named_for_what_it_is() {
    // `segments` a regular file: create_dir_all says only "File exists".
    let dir = tempdir();
    let store_dir = dir.path().join("store");
    KvStore::open(&store_dir, config(0, 64))
        .unwrap()
        .close()
        .unwrap();
    let segments = store_dir.join("segments");
    std::fs::remove_dir_all(&segments).unwrap();
    std::fs::write(&segments, b"x").unwrap();
    let err = KvStore::open(&store_dir, config(0, 64)).err().unwrap();
    let msg = err.to_string();
    assert!(msg.contains("segments"), "{msg}");
    assert!(msg.contains("not a directory but a regular file"), "{msg}");
    std::fs::remove_file(&segments).unwrap();

    // The manifest a symbolic link that loops: named, not taken for a missing manifest
    // (which made the store look empty but not new: "not empty and not a store").
    let manifest = store_dir.join("sluice-kv.json");
    let saved = std::fs::read(&manifest).unwrap();
    std::fs::remove_file(&manifest).unwrap();
    std::os::unix::fs::symlink(&manifest, &manifest).unwrap();
    let err = KvStore::open(&store_dir, config(0, 64)).err().unwrap();
    assert!(err.to_string().contains("sluice-kv.json"), "{err}");
    std::fs::remove_file(&manifest).unwrap();
    std::fs::write(&manifest, saved).unwrap();
    KvStore::open(&store_dir, config(0, 64))
        .unwrap()
        .close()
        .unwrap();
}

/// Issue 27 #16: an SSD budget of N blocks holds N blocks. The policy used to get the
/// budget less two segments, the low watermark and the segment headers (about 0.8 N); the
/// on-disk overhead is now on top of the budget, and reported.
#[test]
fn an_ssd_budget_of_n_blocks_keeps_n_blocks() {
    for spec in ["lru", "fifo", "s3fifo", "arc"] {
        let dir = tempdir();
        let mut cfg = config(0, 0);
        cfg.ssd_bytes = 200 * BLOCK;
        cfg.ssd_policy = PolicyConfig::parse(spec).unwrap();
        let store = KvStore::open(dir.path(), cfg.clone()).unwrap();
        // The same key sequence through the policy library at the capacity the user gave.
        let slot = cfg.slot_bytes();
        let mut model = cfg.ssd_policy.build(200 * slot).unwrap();
        let mut ev = Vec::new();
        let mut rng = 7u64;
        for step in 0..1500 {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = (rng >> 33) % 260;
            let want = model.access(&Request::new(store_fp(&store, id), slot), &mut ev);
            let live_hit = lookup(&store, &[id]) == 1;
            assert_eq!(
                live_hit,
                want == Access::Hit,
                "{spec}: step {step}, key {id}"
            );
            if live_hit {
                assert_eq!(get(&store, &[id]), vec![true]);
            } else {
                put(&store, &[id]);
            }
        }
        let s = store.stats().ssd.unwrap();
        assert_eq!(s.capacity_blocks, 200, "{spec}");
        let limit = s
            .disk_bytes_limit
            .expect("an SSD tier reports its disk limit");
        assert!(s.allocated_bytes <= limit, "{spec}: {s:?}");
    }
    // With LRU, 200 distinct blocks put into a 200-block budget are all there.
    let dir = tempdir();
    let mut cfg = config(0, 0);
    cfg.ssd_bytes = 200 * BLOCK;
    let store = KvStore::open(dir.path(), cfg).unwrap();
    let ids: Vec<u64> = (0..200).collect();
    for chunk in ids.chunks(10) {
        assert_eq!(put(&store, chunk), vec![true; 10]);
    }
    assert_eq!(lookup(&store, &ids), 200);
}

/// Issue 27 #14: a put batch larger than a tier. 900 blocks into a 64 MiB tier used to
/// drop its own newest keys (no space) and evict its oldest (the policy), so a lookup of
/// the chain found nothing, and the evictions counted as put failures. A tier now takes a
/// batch's first keys up to its capacity (lookups are prefix lookups: the first keys of a
/// chain are the valuable ones) and declines the rest; nothing of that is a failure.
#[test]
fn a_put_batch_larger_than_a_tier_keeps_its_prefix_and_counts_no_failures() {
    for (dram, ssd, mode) in [
        (0, 100, WriteMode::WriteThrough),
        (40, 0, WriteMode::WriteThrough),
        (40, 100, WriteMode::WriteThrough),
        (40, 100, WriteMode::WriteBack),
    ] {
        let what = format!("dram {dram}, ssd {ssd}, {mode:?}");
        let dir = tempdir();
        let mut cfg = config(dram, 0);
        cfg.ssd_bytes = ssd * BLOCK;
        cfg.write_mode = mode;
        let store = KvStore::open(dir.path(), cfg).unwrap();
        // What the batch can keep: the SSD's blocks when puts write through it, else DRAM's
        // and (write-back) the SSD's for the keys DRAM declined.
        let kept = match (ssd, mode) {
            (0, _) => dram,
            (_, WriteMode::WriteThrough) => ssd,
            (_, WriteMode::WriteBack) => dram + ssd,
        } as usize;
        for ids in [(0..250).collect::<Vec<u64>>(), (1000..3000).collect()] {
            let ok = put(&store, &ids);
            assert_eq!(ok.iter().filter(|o| **o).count(), kept, "{what}");
            assert!(
                ok[..kept].iter().all(|o| *o),
                "{what}: the first keys are kept"
            );
            assert_eq!(lookup(&store, &ids), kept, "{what}");
            assert_eq!(get(&store, &ids[..kept]), vec![true; kept], "{what}");
        }
        let s = store.stats();
        assert_eq!(s.put_failures, 0, "{what}: {s:?}");
        assert_eq!(
            s.put_declined,
            (250 + 2000 - 2 * kept) as u64,
            "{what}: {s:?}"
        );
    }
}
