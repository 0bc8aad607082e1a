//! The read plan: which byte ranges to read, in which order, into which
//! buffers.
//!
//! Selected tensors are taken in file order and coalesced into *windows*:
//! one contiguous, aligned byte range per window, read into one buffer.
//! A window grows while the next tensor starts within `max_gap_bytes` of the
//! previous one and the window stays under `window_bytes`; a tensor larger
//! than that gets a window to itself. Window edges are rounded out to the
//! direct-I/O alignment, so every read is valid under O_DIRECT, and a tensor
//! sits in its buffer at the same offset modulo the alignment as in the file
//! (its dtype alignment is therefore whatever the file gave it).
//!
//! Each window is then cut into `chunk_bytes` reads, the unit the engines
//! keep in flight. Zero-byte tensors need no I/O and are planned apart.

use std::collections::HashSet;

use sluice_formats::{Checkpoint, Dtype};

use crate::error::LoadError;

/// A tensor's place in a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Byte offset of the tensor inside its window's buffer.
    pub window_offset: usize,
    pub byte_len: usize,
}

/// One contiguous read into one buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Index of the shard in `Checkpoint::shards`.
    pub shard: usize,
    /// Aligned file offset where the read starts.
    pub file_offset: u64,
    /// Aligned length of the read (may run past end of file; the tail read
    /// comes back short, which is expected).
    pub read_len: usize,
    /// Bytes of this window that must be present: up to the last tensor's end.
    pub needed_len: usize,
    pub tensors: Vec<PlannedTensor>,
}

/// Shape knobs for [`ReadPlan::build`].
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    pub window_bytes: usize,
    pub max_gap_bytes: u64,
    /// Alignment of window edges (the largest direct-I/O alignment among the
    /// files, at least a page).
    pub align: usize,
}

/// The whole plan for one load.
#[derive(Clone, Debug, Default)]
pub struct ReadPlan {
    pub windows: Vec<WindowPlan>,
    /// Zero-byte tensors (any shape with a 0 dimension).
    pub empty: Vec<PlannedTensor>,
    /// Sum of the selected tensors' bytes.
    pub tensor_bytes: u64,
    /// Sum of the windows' aligned read lengths.
    pub read_bytes: u64,
}

impl ReadPlan {
    /// Plans reads for `names` (all tensors when `None`). A name the
    /// checkpoint lacks is an error, so a typo never silently loads nothing.
    pub fn build(
        ckpt: &Checkpoint,
        names: Option<&[String]>,
        opts: PlanOptions,
    ) -> Result<ReadPlan, LoadError> {
        let selected = select(ckpt, names)?;
        let mut plan = ReadPlan::default();
        for (shard_index, shard) in ckpt.shards.iter().enumerate() {
            let mut builder = WindowBuilder {
                opts,
                shard: shard_index,
                current: None,
                out: &mut plan.windows,
            };
            for t in &shard.header.tensors {
                if selected
                    .as_ref()
                    .is_some_and(|s| !s.contains(t.name.as_str()))
                {
                    continue;
                }
                let byte_len = usize::try_from(t.byte_len()).map_err(|_| {
                    LoadError::config(format!("tensor {:?}", t.name), "does not fit in memory")
                })?;
                let planned = PlannedTensor {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    window_offset: 0,
                    byte_len,
                };
                plan.tensor_bytes += t.byte_len();
                if byte_len == 0 {
                    plan.empty.push(planned);
                    continue;
                }
                builder.add(shard.header.data_start + t.start, planned);
            }
            builder.finish();
        }
        plan.read_bytes = plan.windows.iter().map(|w| w.read_len as u64).sum();
        Ok(plan)
    }

    /// Reorders windows so that no two neighbours exceed `limit` together,
    /// where possible, keeping file order otherwise.
    ///
    /// A streaming consumer holds the window it was last given while the
    /// next is read, so two big tensors side by side (`lm_head` and
    /// `model.embed_tokens` sort next to each other) would need both at
    /// once. Deferring the second past a small window costs one seek and
    /// lets a limit of little more than the largest tensor work.
    pub fn order_for_limit(&mut self, capacity: impl Fn(usize) -> u64, limit: u64) {
        let fits = |a: Option<&WindowPlan>, b: &WindowPlan| {
            a.is_none_or(|a| capacity(a.read_len) + capacity(b.read_len) <= limit)
        };
        let mut ordered: Vec<WindowPlan> = Vec::with_capacity(self.windows.len());
        let mut deferred: std::collections::VecDeque<WindowPlan> = Default::default();
        for w in std::mem::take(&mut self.windows) {
            if fits(ordered.last(), &w) {
                ordered.push(w);
            } else {
                deferred.push_back(w);
            }
            while deferred.front().is_some_and(|d| fits(ordered.last(), d)) {
                ordered.extend(deferred.pop_front());
            }
        }
        ordered.extend(deferred);
        self.windows = ordered;
    }

    /// Number of tensors planned, empty ones included.
    pub fn tensor_count(&self) -> usize {
        self.empty.len() + self.windows.iter().map(|w| w.tensors.len()).sum::<usize>()
    }

    /// The largest window's read length.
    pub fn largest_window(&self) -> Option<&WindowPlan> {
        self.windows.iter().max_by_key(|w| w.read_len)
    }
}

fn select<'a>(
    ckpt: &Checkpoint,
    names: Option<&'a [String]>,
) -> Result<Option<HashSet<&'a str>>, LoadError> {
    let Some(names) = names else { return Ok(None) };
    let known: HashSet<&str> = ckpt.tensors().map(|(_, t)| t.name.as_str()).collect();
    for name in names {
        if !known.contains(name.as_str()) {
            return Err(LoadError::UnknownTensor {
                name: name.clone(),
                checkpoint: ckpt.source.path().to_path_buf(),
            });
        }
    }
    Ok(Some(names.iter().map(String::as_str).collect()))
}

struct OpenWindow {
    file_start: u64,
    data_end: u64,
    tensors: Vec<(u64, PlannedTensor)>,
}

struct WindowBuilder<'a> {
    opts: PlanOptions,
    shard: usize,
    current: Option<OpenWindow>,
    out: &'a mut Vec<WindowPlan>,
}

impl WindowBuilder<'_> {
    fn add(&mut self, abs_start: u64, tensor: PlannedTensor) {
        let abs_end = abs_start + tensor.byte_len as u64;
        let align = self.opts.align as u64;
        if let Some(w) = &self.current {
            let gap_ok = abs_start <= w.data_end.saturating_add(self.opts.max_gap_bytes);
            let size_ok =
                abs_end.next_multiple_of(align) - w.file_start <= self.opts.window_bytes as u64;
            if !(gap_ok && size_ok && abs_start >= w.data_end) {
                self.finish();
            }
        }
        let w = self.current.get_or_insert_with(|| OpenWindow {
            file_start: abs_start / align * align,
            data_end: abs_start,
            tensors: Vec::new(),
        });
        w.data_end = w.data_end.max(abs_end);
        w.tensors.push((abs_start, tensor));
    }

    fn finish(&mut self) {
        let Some(w) = self.current.take() else { return };
        let align = self.opts.align as u64;
        let tensors = w
            .tensors
            .into_iter()
            .map(|(abs_start, mut t)| {
                t.window_offset = (abs_start - w.file_start) as usize;
                t
            })
            .collect();
        self.out.push(WindowPlan {
            shard: self.shard,
            file_offset: w.file_start,
            read_len: (w.data_end.next_multiple_of(align) - w.file_start) as usize,
            needed_len: (w.data_end - w.file_start) as usize,
            tensors,
        });
    }
}

/// The reads of one window: `(file_offset, buffer_offset, len)` triples of
/// at most `chunk_bytes` each, covering `read_len` exactly.
pub fn window_chunks(
    w: &WindowPlan,
    chunk_bytes: usize,
) -> impl Iterator<Item = (u64, usize, usize)> + '_ {
    let chunk = chunk_bytes.max(1);
    (0..w.read_len).step_by(chunk).map(move |start| {
        let len = chunk.min(w.read_len - start);
        (w.file_offset + start as u64, start, len)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(read_len: usize, name: &str) -> WindowPlan {
        let tensor = PlannedTensor {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![read_len as u64],
            window_offset: 0,
            byte_len: read_len,
        };
        WindowPlan {
            shard: 0,
            file_offset: 0,
            read_len,
            needed_len: read_len,
            tensors: vec![tensor],
        }
    }

    #[test]
    fn order_for_limit_separates_adjacent_large_windows() {
        let mut plan = ReadPlan {
            windows: vec![
                window(300, "lm_head"),
                window(300, "embed"),
                window(60, "a"),
                window(60, "b"),
            ],
            ..Default::default()
        };
        plan.order_for_limit(|n| n as u64, 512);
        let names: Vec<&str> = plan
            .windows
            .iter()
            .map(|w| w.tensors[0].name.as_str())
            .collect();
        assert_eq!(names, ["lm_head", "a", "embed", "b"]);
    }

    #[test]
    fn order_for_limit_keeps_file_order_when_everything_fits() {
        let mut plan = ReadPlan {
            windows: (0..5).map(|i| window(100, &i.to_string())).collect(),
            ..Default::default()
        };
        plan.order_for_limit(|n| n as u64, 512);
        let names: Vec<&str> = plan
            .windows
            .iter()
            .map(|w| w.tensors[0].name.as_str())
            .collect();
        assert_eq!(names, ["0", "1", "2", "3", "4"]);
    }
}
