//! Recording a template while a model loads.
//!
//! Accesses arrive as they happen (`worker`, file, offset, length), from fanotify's
//! pre-content events or from a loader that reports its own reads. Each is merged into its
//! worker's last range when it continues it, so a loader reading 1 MiB pieces leaves one
//! range per contiguous run, not one per read.
//!
//! Merging uses a gap of [`MERGE_GAP_BYTES`] (64 KiB): an access that starts at most
//! 64 KiB past the end of the worker's last range on the same file extends that range.
//! Readers skip a few bytes of headers or alignment padding between tensors; an mmap
//! loader's faults are seen at fault-around granularity (16 pages = 64 KiB), so smaller
//! gaps are noise of the observation, not structure of the load. Prefetching a skipped gap
//! costs at most 64 KiB per range (tens of microseconds at disk bandwidth), while keeping
//! the ranges apart would split one sequential stream into many prefetch submissions.
//! [`Recorder::with_merge_gap`] sets another gap.
//!
//! A Llama-like 16 GiB model read by 4 tensor-parallel workers records about a thousand
//! ranges and encodes in about 9 KiB, well under the format's 1 KiB per GiB target (see
//! `a_16_gib_model_encodes_in_under_1_kib_per_gib` below).

use std::collections::{BTreeMap, HashMap};

use super::{ServiceId, Template, TemplateFile, TemplateRange, WorkerSequence};

/// Default merge gap of [`Recorder`]: 64 KiB, the fault-around window of an mmap reader
/// (see the module documentation for why).
pub const MERGE_GAP_BYTES: u64 = 64 * 1024;

/// Records accesses as they happen, merging each into its worker's last
/// range when it continues it.
///
/// Merge rule: an access on the same file as the worker's last range,
/// starting inside `[last.offset, last.end + merge gap]`, extends the last
/// range to the union of both (so overlaps and re-reads are absorbed);
/// anything else starts a new range. Zero-length accesses are ignored, and
/// accesses are clipped to the file's size (fanotify rounds ranges up to
/// whole pages, past the end of the last one).
#[derive(Debug, Clone)]
pub struct Recorder {
    service: ServiceId,
    spec: String,
    files: Vec<TemplateFile>,
    by_path: HashMap<String, u32>,
    workers: BTreeMap<u32, Vec<TemplateRange>>,
    merge_gap_bytes: u64,
}

impl Recorder {
    /// An empty recording for `service`, merging with [`MERGE_GAP_BYTES`].
    pub fn new(service: ServiceId, spec: String) -> Recorder {
        Recorder {
            service,
            spec,
            files: Vec::new(),
            by_path: HashMap::new(),
            workers: BTreeMap::new(),
            merge_gap_bytes: MERGE_GAP_BYTES,
        }
    }

    /// Merges accesses up to `gap_bytes` past a range's end into it (0:
    /// only adjacent or overlapping accesses merge).
    pub fn with_merge_gap(mut self, gap_bytes: u64) -> Recorder {
        self.merge_gap_bytes = gap_bytes;
        self
    }

    /// Interns a file and returns its index. `path` is relative to the model
    /// directory (see [`super::relative_path`]); `size` and `mtime_ns` are its stat
    /// now. A path seen before returns its first index and keeps its first
    /// stat.
    pub fn file(&mut self, path: String, size: u64, mtime_ns: i64) -> u32 {
        if let Some(&index) = self.by_path.get(&path) {
            return index;
        }
        let Ok(index) = u32::try_from(self.files.len()) else {
            tracing::warn!(path, "template recorder: file table full; file ignored");
            return u32::MAX;
        };
        self.by_path.insert(path.clone(), index);
        self.files.push(TemplateFile {
            path,
            size,
            mtime_ns,
        });
        index
    }

    /// Records that `worker` read `len` bytes of `file` at `offset`.
    pub fn access(&mut self, worker: u32, file: u32, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let Some(size) = self.files.get(file as usize).map(|f| f.size) else {
            tracing::warn!(
                file,
                worker,
                "template recorder: access to a file index it never issued; ignored"
            );
            return;
        };
        if offset >= size {
            return;
        }
        let end = offset.saturating_add(len).min(size);
        let ranges = self.workers.entry(worker).or_default();
        if let Some(last) = ranges.last_mut() {
            let reach = last.end().saturating_add(self.merge_gap_bytes);
            if last.file == file && offset >= last.offset && offset <= reach {
                last.len = end.max(last.end()) - last.offset;
                return;
            }
        }
        ranges.push(TemplateRange {
            file,
            offset,
            len: end - offset,
        });
    }

    /// The template: workers sorted by number.
    pub fn finish(self) -> Template {
        Template {
            service: self.service,
            spec: self.spec,
            files: self.files,
            workers: self
                .workers
                .into_iter()
                .map(|(worker, ranges)| WorkerSequence { worker, ranges })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const MIB: u64 = 1 << 20;
    const PAGE: u64 = 4096;

    fn range(file: u32, offset: u64, len: u64) -> TemplateRange {
        TemplateRange { file, offset, len }
    }

    fn recorder() -> Recorder {
        let mut rec = Recorder::new(ServiceId::from_spec("x"), "x".into());
        assert_eq!(rec.file("a.safetensors".into(), 100 * MIB, 1), 0);
        assert_eq!(rec.file("b.safetensors".into(), 100 * MIB, 2), 1);
        rec
    }

    fn ranges_of(t: &Template, worker: u32) -> Vec<TemplateRange> {
        t.worker(worker).unwrap().ranges.clone()
    }

    #[test]
    fn recorder_merges_adjacent_accesses_into_one_range() {
        let mut rec = recorder();
        for i in 0..8 {
            rec.access(0, 0, i * MIB, MIB);
        }
        assert_eq!(ranges_of(&rec.finish(), 0), [range(0, 0, 8 * MIB)]);
    }

    #[test]
    fn recorder_absorbs_overlaps_and_rereads() {
        let mut rec = recorder();
        rec.access(0, 0, 1000, 100);
        rec.access(0, 0, 1050, 100); // overlaps the end
        rec.access(0, 0, 1010, 20); // re-read inside
        rec.access(0, 0, 1000, 150); // exact re-read
        assert_eq!(ranges_of(&rec.finish(), 0), [range(0, 1000, 150)]);
    }

    #[test]
    fn recorder_merges_gaps_up_to_the_merge_gap_only() {
        let mut rec = recorder();
        rec.access(0, 0, 0, 100);
        rec.access(0, 0, 100 + MERGE_GAP_BYTES, 10); // gap of exactly 64 KiB
        let end = 110 + MERGE_GAP_BYTES;
        rec.access(0, 0, end + MERGE_GAP_BYTES + 1, 10); // one byte too far
        let expect = [range(0, 0, end), range(0, end + MERGE_GAP_BYTES + 1, 10)];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn a_zero_merge_gap_keeps_gapped_accesses_apart() {
        let mut rec = recorder().with_merge_gap(0);
        rec.access(0, 0, 0, 100);
        rec.access(0, 0, 100, 100); // adjacent still merges
        rec.access(0, 0, 201, 100);
        let expect = [range(0, 0, 200), range(0, 201, 100)];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn recorder_starts_a_new_range_on_another_file_or_going_backwards() {
        let mut rec = recorder();
        rec.access(0, 0, MIB, MIB);
        rec.access(0, 1, 2 * MIB, MIB); // same offsets, other file
        rec.access(0, 0, 2 * MIB, MIB); // back to file 0, not merged across
        rec.access(0, 0, 0, 10); // backwards on the same file
        let expect = [
            range(0, MIB, MIB),
            range(1, 2 * MIB, MIB),
            range(0, 2 * MIB, MIB),
            range(0, 0, 10),
        ];
        assert_eq!(ranges_of(&rec.finish(), 0), expect);
    }

    #[test]
    fn recorder_keeps_workers_apart_and_sorts_them() {
        let mut rec = recorder();
        for i in 0..4 {
            rec.access(2, 0, (2 * i + 1) * MIB, MIB);
            rec.access(0, 0, 2 * i * MIB, MIB);
        }
        let t = rec.finish();
        let numbers: Vec<u32> = t.workers.iter().map(|w| w.worker).collect();
        assert_eq!(numbers, [0, 2]);
        // Worker 0 read even MiBs, 1 MiB apart: more than the merge gap.
        assert_eq!(ranges_of(&t, 0).len(), 4);
        assert_eq!(ranges_of(&t, 2)[0], range(0, MIB, MIB));
    }

    #[test]
    fn recorder_ignores_empty_unknown_and_past_the_end_accesses() {
        let mut rec = recorder();
        rec.access(5, 0, 0, 0); // zero-length: no worker entry either
        rec.access(6, 9, 0, 10); // file index never issued
        rec.access(7, 0, 100 * MIB, 4096); // at EOF
        rec.access(8, 0, 100 * MIB - 100, 4096); // straddles EOF: clipped
        let t = rec.finish();
        assert_eq!(t.workers.len(), 1);
        assert_eq!(ranges_of(&t, 8), [range(0, 100 * MIB - 100, 100)]);
        t.validate().unwrap();
    }

    #[test]
    fn recorder_interns_each_path_once_with_its_first_stat() {
        let mut rec = recorder();
        assert_eq!(rec.file("a.safetensors".into(), 1, 1), 0);
        assert_eq!(rec.file("c.safetensors".into(), 1, 1), 2);
        let t = rec.finish();
        assert_eq!(t.files.len(), 3);
        assert_eq!(t.files[0].size, 100 * MIB);
    }

    /// One safetensors-style shard of the synthetic model.
    struct Shard {
        /// Bytes of the 8-byte length plus JSON header.
        header_bytes: u64,
        /// `(offset, len, split)` per tensor; `split` tensors are divided
        /// among tensor-parallel workers, the others (norms) replicated.
        tensors: Vec<(u64, u64, bool)>,
        size: u64,
    }

    /// A Llama-like bf16 checkpoint of about 16 GiB in 4 shards: embeddings
    /// and LM head of 128256 x 4096, 32 layers of q/k/v/o (16-32 MiB), a
    /// gate/up/down MLP of 118 MiB each and two 8 KiB norms.
    fn llama_like_shards() -> Vec<Shard> {
        let (hidden, kv, ffn, vocab) = (4096u64, 2048u64, 15104u64, 128_256u64);
        let mut tensors = vec![(vocab * hidden * 2, true)];
        for _ in 0..32 {
            tensors.extend([
                (hidden * 2, false),
                (hidden * hidden * 2, true),
                (kv * hidden * 2, true),
                (kv * hidden * 2, true),
                (hidden * hidden * 2, true),
                (hidden * 2, false),
                (ffn * hidden * 2, true),
                (ffn * hidden * 2, true),
                (ffn * hidden * 2, true),
            ]);
        }
        tensors.push((hidden * 2, false));
        tensors.push((vocab * hidden * 2, true));
        let total: u64 = tensors.iter().map(|t| t.0).sum();
        let mut groups: Vec<Vec<(u64, bool)>> = vec![Vec::new()];
        let mut in_group = 0;
        for t in tensors {
            if in_group >= total / 4 && groups.len() < 4 {
                groups.push(Vec::new());
                in_group = 0;
            }
            in_group += t.0;
            groups.last_mut().unwrap().push(t);
        }
        groups
            .into_iter()
            .map(|group| {
                // ~120 bytes of JSON per tensor, padded to 8 as safetensors does.
                let header_bytes = 8 + (group.len() as u64 * 120).next_multiple_of(8);
                let mut offset = header_bytes;
                let tensors = group
                    .into_iter()
                    .map(|(len, split)| {
                        offset += len;
                        (offset - len, len, split)
                    })
                    .collect();
                Shard {
                    header_bytes,
                    tensors,
                    size: offset,
                }
            })
            .collect()
    }

    /// Plays `[start, end)` into the recorder as a loader's accesses arrive:
    /// 1 MiB pieces, rounded out to whole pages as fanotify reports them.
    fn pieces(start: u64, end: u64) -> Vec<(u64, u64)> {
        (start..end)
            .step_by(MIB as usize)
            .map(|s| {
                let e = (s + MIB).min(end).next_multiple_of(PAGE);
                let s = s / PAGE * PAGE;
                (s, e - s)
            })
            .collect()
    }

    /// Records `workers` loader processes reading the shards in tensor
    /// order; with several workers each reads its quarter (row block) of
    /// every split tensor, their accesses interleaved piece by piece.
    fn record_load(shards: &[Shard], workers: u32) -> Template {
        let spec = format!("llama-like-16g tp={workers}");
        let mut rec = Recorder::new(ServiceId::from_spec(&spec), spec);
        for (i, shard) in shards.iter().enumerate() {
            let f = rec.file(
                format!("model-{:05}-of-00004.safetensors", i + 1),
                shard.size,
                0,
            );
            for w in 0..workers {
                rec.access(w, f, 0, 8);
                rec.access(w, f, 8, shard.header_bytes - 8);
            }
            for &(offset, len, split) in &shard.tensors {
                let parts: Vec<(u32, Vec<(u64, u64)>)> = (0..workers)
                    .map(|w| {
                        let (n, w64) = (u64::from(workers), u64::from(w));
                        let part = if split {
                            pieces(offset + w64 * len / n, offset + (w64 + 1) * len / n)
                        } else {
                            pieces(offset, offset + len)
                        };
                        (w, part)
                    })
                    .collect();
                let most = parts.iter().map(|p| p.1.len()).max().unwrap_or(0);
                for k in 0..most {
                    for (w, part) in &parts {
                        if let Some(&(o, l)) = part.get(k) {
                            rec.access(*w, f, o, l);
                        }
                    }
                }
            }
        }
        rec.finish()
    }

    #[test]
    fn a_16_gib_model_encodes_in_under_1_kib_per_gib() {
        let shards = llama_like_shards();
        assert_eq!(shards.len(), 4);
        let model_bytes: u64 = shards.iter().map(|s| s.size).sum();
        let model_gib = model_bytes as f64 / (1u64 << 30) as f64;
        assert!((15.5..16.5).contains(&model_gib), "{model_gib} GiB");
        let budget = 1024.0 * model_gib;
        for workers in [1u32, 4] {
            let t = record_load(&shards, workers);
            let bytes = t.encode();
            eprintln!(
                "template size: {:.2} GiB model, {workers} worker(s): {} ranges, {} bytes \
                 ({:.0} bytes/GiB, budget {budget:.0})",
                model_gib,
                t.range_count(),
                bytes.len(),
                bytes.len() as f64 / model_gib
            );
            assert!((bytes.len() as f64) <= budget, "{} bytes", bytes.len());
            assert_eq!(Template::decode(&bytes).unwrap(), t);
            // Every byte is read by someone; replication and page rounding
            // add little.
            assert!(t.total_bytes() >= model_bytes);
            assert!(t.total_bytes() <= model_bytes + 64 * MIB);
            if workers == 1 {
                assert_eq!(t.range_count(), 4, "one range per shard");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn recordings_are_valid_and_cover_every_access(
            accesses in prop::collection::vec((0u32..3, 0u32..2, 0u64..4096, 0u64..600), 0..60),
        ) {
            let mut rec = Recorder::new(ServiceId::from_spec("p"), "p".into()).with_merge_gap(64);
            rec.file("a".into(), 3000, 0);
            rec.file("b".into(), 5000, 0);
            for &(w, f, o, l) in &accesses {
                rec.access(w, f, o, l);
            }
            let t = rec.finish();
            t.validate().unwrap();
            prop_assert_eq!(Template::decode(&t.encode()).unwrap(), t.clone());
            let size = [3000u64, 5000];
            for &(w, f, o, l) in &accesses {
                let end = (o + l).min(size[f as usize]);
                for byte in [o, end.saturating_sub(1)] {
                    if l > 0 && o < end {
                        prop_assert!(t.position_of(w, f, byte).is_some(), "{} {} {}", w, f, byte);
                    }
                }
            }
        }
    }
}
