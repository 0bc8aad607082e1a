//! Random access to one tensor, or a block of it, for `safe_open`.
//!
//! An [`OpenCheckpoint`] keeps the descriptor each header was validated
//! from, so every later read sees those files: a checkpoint replaced on disk
//! after opening (an atomic rename) still yields its own bytes, as
//! safetensors' mapping does, and one truncated in place fails with
//! [`LoadError::Truncated`] naming the file. A read is one or a few `pread`s
//! into a fresh buffer: no engine, ring or pool per call, so `get_tensor`
//! costs a system call plus the copy. Tensors of 32 MiB and more are read
//! by up to four threads, since a cold one would otherwise wait on one
//! queue-depth-1 stream.
//!
//! A block (`get_slice`) is a range per dimension. Its bytes are the runs
//! of the row-major layout it covers: one run when only the first sliced
//! dimension is narrowed, one per outer index otherwise. Runs closer than
//! [`GAP_READ_OVER`] are read as one span with `preadv`, the runs straight
//! into the output and the gaps into a discard buffer, so a slice of a
//! narrow last dimension is not a million tiny reads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_formats::{Checkpoint, TensorInfo};

use crate::checkpoint_reader::ReadOptions;
use crate::config::LoadConfig;
use crate::error::LoadError;
use crate::loader::Loader;
use crate::open_shards::open_shard_files;
use crate::shard_file::ShardFile;

/// Runs closer than this are read as one span (the gap is read and thrown
/// away): 64 KiB costs less to read than a second system call's latency on a
/// cold device.
const GAP_READ_OVER: u64 = 64 << 10;
/// Largest span one job reads, so a long run of small pieces still splits
/// across threads.
const MAX_SPAN: u64 = 16 << 20;
/// Runs per `preadv`: with a gap between each pair that is twice as many
/// iovecs, within Linux's IOV_MAX of 1024.
const RUNS_PER_CALL: usize = 512;
/// Reads at least this large are split across threads.
const PARALLEL_FROM: usize = 32 << 20;
/// Piece size for split reads: large enough for readahead to stream.
const PIECE: usize = 8 << 20;
/// Threads for a split read: four 8 MiB streams keep a virtio or NVMe device
/// busy without a pool; the machines we target have at least two cores.
const READ_THREADS: usize = 4;

/// A checkpoint held open for per-tensor reads.
#[derive(Debug)]
pub struct OpenCheckpoint {
    checkpoint: Checkpoint,
    files: Arc<[ShardFile]>,
    /// Absent shards left out (only with `allow_partial`).
    missing: Vec<PathBuf>,
    /// Name → (shard, index in that shard's header): lookups are O(1)
    /// however many tensors the checkpoint has.
    by_name: HashMap<String, (usize, usize)>,
}

/// A tensor's bytes in a buffer aligned for any element type.
pub struct TensorBytes {
    words: Vec<u64>,
    len: usize,
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorBytes({} bytes)", self.len)
    }
}

impl TensorBytes {
    fn zeroed_for(len: usize) -> TensorBytes {
        // u64 words: 8-byte alignment covers every safetensors dtype. The
        // allocator hands large sizes fresh zero pages, so this costs no
        // memset; the pages are faulted in by the read that fills them.
        TensorBytes {
            words: vec![0u64; len.div_ceil(8)],
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A contiguous stretch of the file that lands contiguously in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    file_offset: u64,
    len: usize,
}

impl OpenCheckpoint {
    /// Opens and validates the checkpoint at `path`, keeping its files open.
    pub fn open(path: &Path, options: ReadOptions) -> Result<OpenCheckpoint, LoadError> {
        let found = open_shard_files(path, options)?;
        let mut by_name = HashMap::with_capacity(found.checkpoint.tensor_count());
        for (shard_index, shard) in found.checkpoint.shards.iter().enumerate() {
            for (i, tensor) in shard.header.tensors.iter().enumerate() {
                by_name.insert(tensor.name.clone(), (shard_index, i));
            }
        }
        Ok(OpenCheckpoint {
            checkpoint: found.checkpoint,
            files: found.files.into(),
            missing: found.missing,
            by_name,
        })
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Shards left out because they are absent (only with `allow_partial`).
    pub fn missing_shards(&self) -> &[PathBuf] {
        &self.missing
    }

    /// A loader over these same files (for a whole load or a stream).
    pub fn loader(&self, config: LoadConfig) -> Result<Loader, LoadError> {
        Loader::from_open_files(
            self.checkpoint.clone(),
            Arc::clone(&self.files),
            self.missing.clone(),
            config,
        )
    }

    /// The shard index and description of `name`, if present.
    pub fn find(&self, name: &str) -> Option<(usize, &TensorInfo)> {
        let &(shard, i) = self.by_name.get(name)?;
        Some((shard, &self.checkpoint.shards[shard].header.tensors[i]))
    }

    fn locate(&self, name: &str) -> Result<(usize, &TensorInfo), LoadError> {
        self.find(name).ok_or_else(|| LoadError::UnknownTensor {
            name: name.to_string(),
            checkpoint: self.checkpoint.source.path().to_path_buf(),
        })
    }

    /// The whole of tensor `name`.
    pub fn read_tensor(&self, name: &str) -> Result<TensorBytes, LoadError> {
        let (shard, tensor) = self.locate(name)?;
        let start = self.checkpoint.shards[shard].header.data_start + tensor.start;
        let len = usize::try_from(tensor.byte_len()).map_err(|_| too_large(name))?;
        let mut out = TensorBytes::zeroed_for(len);
        self.read_runs(
            shard,
            &[Run {
                file_offset: start,
                len,
            }],
            out.as_mut_slice(),
        )?;
        Ok(out)
    }

    /// Bytes `offset..offset + out.len()` of tensor `name`, into `out` (for callers that
    /// stage a tensor through buffers of their own, such as pinned windows for a GPU).
    pub fn read_tensor_range(
        &self,
        name: &str,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), LoadError> {
        let (shard, tensor) = self.locate(name)?;
        let end = offset.checked_add(out.len() as u64);
        if end.is_none_or(|end| end > tensor.byte_len()) {
            return Err(LoadError::config(
                format!("bytes {offset}..+{} of tensor {name:?}", out.len()),
                format!("outside the tensor's {} bytes", tensor.byte_len()),
            ));
        }
        let start = self.checkpoint.shards[shard].header.data_start + tensor.start + offset;
        self.read_runs(
            shard,
            &[Run {
                file_offset: start,
                len: out.len(),
            }],
            out,
        )
    }

    /// The block of tensor `name` with `ranges[d] = (lo, hi)` along each
    /// dimension `d`, in row-major order; reads only the bytes it covers
    /// (plus gaps under [`GAP_READ_OVER`]).
    pub fn read_block(&self, name: &str, ranges: &[(u64, u64)]) -> Result<TensorBytes, LoadError> {
        let (shard, tensor) = self.locate(name)?;
        let bad = |why: String| LoadError::config(format!("slice of tensor {name:?}"), why);
        if ranges.len() != tensor.shape.len() {
            return Err(bad(format!(
                "{} ranges for a tensor of {} dimensions",
                ranges.len(),
                tensor.shape.len()
            )));
        }
        for (d, (&(lo, hi), &size)) in ranges.iter().zip(&tensor.shape).enumerate() {
            if lo > hi || hi > size {
                return Err(bad(format!(
                    "range {lo}..{hi} of dimension {d} is outside 0..{size}"
                )));
            }
        }
        let bits = tensor.dtype.bits();
        if bits % 8 != 0 && ranges.last().is_some_and(|&(lo, hi)| (lo | hi) % 2 != 0) {
            return Err(bad(format!(
                "a {} tensor packs two values per byte; its last dimension can only be cut at even indices",
                tensor.dtype.as_str()
            )));
        }
        let data_start = self.checkpoint.shards[shard].header.data_start + tensor.start;
        let runs = block_runs(&tensor.shape, bits, ranges, data_start);
        let len = runs
            .iter()
            .try_fold(0usize, |acc, r| acc.checked_add(r.len));
        let len = len.ok_or_else(|| too_large(name))?;
        let mut out = TensorBytes::zeroed_for(len);
        self.read_runs(shard, &runs, out.as_mut_slice())?;
        Ok(out)
    }

    /// Reads `runs` of shard `shard` into `out`, back to back.
    fn read_runs(&self, shard: usize, runs: &[Run], out: &mut [u8]) -> Result<(), LoadError> {
        let file = &self.files[shard];
        let path = &self.checkpoint.shards[shard].path;
        if let [run] = runs {
            // The common `get_tensor` case: one `pread`, no job lists.
            if run.len <= PIECE {
                return read_exact(file, path, run.file_offset, out);
            }
        }
        // Spans: consecutive runs close enough to read as one.
        let mut jobs: Vec<(Vec<Run>, &mut [u8])> = Vec::new();
        let mut rest = out;
        let mut i = 0;
        while i < runs.len() {
            let first = runs[i];
            let mut j = i + 1;
            let mut span_end = first.file_offset + first.len as u64;
            let mut out_len = first.len;
            while j < runs.len() {
                let next = runs[j];
                let end = next.file_offset + next.len as u64;
                if next.file_offset < span_end
                    || next.file_offset - span_end > GAP_READ_OVER
                    || end - first.file_offset > MAX_SPAN
                {
                    break;
                }
                span_end = end;
                out_len += next.len;
                j += 1;
            }
            let (dest, tail) = std::mem::take(&mut rest).split_at_mut(out_len);
            rest = tail;
            if j == i + 1 {
                // A lone run reads straight into the output, in pieces a
                // thread each can take.
                let mut dest = dest;
                let mut offset = first.file_offset;
                while !dest.is_empty() {
                    let n = dest.len().min(PIECE);
                    let (piece, tail) = std::mem::take(&mut dest).split_at_mut(n);
                    let run = Run {
                        file_offset: offset,
                        len: n,
                    };
                    jobs.push((vec![run], piece));
                    offset += n as u64;
                    dest = tail;
                }
            } else {
                jobs.push((runs[i..j].to_vec(), dest));
            }
            i = j;
        }
        let total: usize = jobs.iter().map(|(_, d)| d.len()).sum();
        if total < PARALLEL_FROM || jobs.len() < 2 {
            return jobs
                .into_iter()
                .try_for_each(|(runs, dest)| read_span(file, path, &runs, dest));
        }
        // Deal the jobs round-robin: neighbours go to different threads, so
        // the threads advance through the file side by side.
        let threads = READ_THREADS.min(jobs.len());
        let mut shares: Vec<Vec<(Vec<Run>, &mut [u8])>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (k, job) in jobs.into_iter().enumerate() {
            shares[k % threads].push(job);
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = shares
                .into_iter()
                .map(|share| {
                    scope.spawn(move || {
                        share
                            .into_iter()
                            .try_for_each(|(runs, dest)| read_span(file, path, &runs, dest))
                    })
                })
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or(Err(LoadError::Cancelled)))
        })
    }
}

fn too_large(name: &str) -> LoadError {
    LoadError::config(
        format!("tensor {name:?}"),
        "is larger than this machine's address space",
    )
}

/// Reads one span (`runs` consecutive in the file, within [`MAX_SPAN`]) into
/// `dest`, which is exactly the runs' total length.
///
/// Each group of runs is one `preadv`: the runs land in `dest` in place, and
/// the gaps between them go to one small discard buffer, so there is no
/// scratch copy of the span and one system call per [`RUNS_PER_CALL`] runs.
fn read_span(
    shard: &ShardFile,
    path: &Path,
    runs: &[Run],
    dest: &mut [u8],
) -> Result<(), LoadError> {
    if let [run] = runs {
        return read_exact(shard, path, run.file_offset, dest);
    }
    let Some(file) = shard.local() else {
        return read_span_remote(shard, path, runs, dest);
    };
    let max_gap = runs
        .windows(2)
        .map(|w| w[1].file_offset - (w[0].file_offset + w[0].len as u64))
        .max()
        .unwrap_or(0);
    let mut discard = vec![0u8; max_gap as usize];
    let mut at = 0usize;
    for group in runs.chunks(RUNS_PER_CALL) {
        let group_len: usize = group.iter().map(|r| r.len).sum();
        let (head, _) = dest[at..].split_at_mut(group_len);
        let mut iov = Vec::with_capacity(group.len() * 2);
        let mut expected = 0usize;
        let mut out = 0usize;
        for (k, run) in group.iter().enumerate() {
            if k > 0 {
                let prev = group[k - 1];
                let gap = (run.file_offset - (prev.file_offset + prev.len as u64)) as usize;
                if gap > 0 {
                    iov.push(libc::iovec {
                        iov_base: discard.as_mut_ptr().cast(),
                        iov_len: gap,
                    });
                    expected += gap;
                }
            }
            iov.push(libc::iovec {
                // SAFETY (of the later preadv): `out + run.len <= group_len`,
                // so every run's iovec lies inside `head`, and they are disjoint.
                iov_base: head[out..].as_mut_ptr().cast(),
                iov_len: run.len,
            });
            out += run.len;
            expected += run.len;
        }
        let offset = libc::off_t::try_from(group[0].file_offset).map_err(|_| LoadError::Read {
            path: path.to_path_buf(),
            offset: group[0].file_offset,
            len: expected,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        let got = loop {
            // SAFETY: every iovec points into `head` or `discard`, both alive
            // and exclusively borrowed for the call; `iov.len()` is at most
            // 2 * RUNS_PER_CALL, under IOV_MAX.
            let n = unsafe {
                libc::preadv(
                    std::os::fd::AsRawFd::as_raw_fd(file),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    offset,
                )
            };
            if n >= 0 {
                break n as usize;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(LoadError::Read {
                    path: path.to_path_buf(),
                    offset: group[0].file_offset,
                    len: expected,
                    source: err,
                });
            }
        };
        if got < expected {
            // Short (end of file, or a signal part way): finish run by run,
            // which completes the group or names the truncation.
            let mut out = 0usize;
            for run in group {
                read_exact(shard, path, run.file_offset, &mut head[out..out + run.len])?;
                out += run.len;
            }
        }
        at += group_len;
    }
    Ok(())
}

/// A span of a remote object: one ranged read of the whole span (at most
/// [`MAX_SPAN`]), then the runs copied out; a GET per run would pay a round
/// trip each.
fn read_span_remote(
    shard: &ShardFile,
    path: &Path,
    runs: &[Run],
    dest: &mut [u8],
) -> Result<(), LoadError> {
    let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
        return Ok(());
    };
    let start = first.file_offset;
    let end = last.file_offset + last.len as u64;
    let mut span = vec![0u8; (end - start) as usize];
    read_exact(shard, path, start, &mut span)?;
    let mut at = 0usize;
    for run in runs {
        let from = (run.file_offset - start) as usize;
        dest[at..at + run.len].copy_from_slice(&span[from..from + run.len]);
        at += run.len;
    }
    Ok(())
}

/// Fills `dest` from `offset`, or says how much of it the file still had.
fn read_exact(
    file: &ShardFile,
    path: &Path,
    offset: u64,
    dest: &mut [u8],
) -> Result<(), LoadError> {
    let mut done = 0;
    while done < dest.len() {
        match file.read_at(&mut dest[done..], offset + done as u64) {
            Ok(0) => {
                return Err(LoadError::Truncated {
                    path: path.to_path_buf(),
                    offset,
                    expected: dest.len() as u64,
                    got: done as u64,
                })
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(LoadError::read(
                    path,
                    offset + done as u64,
                    dest.len() - done,
                    source,
                ))
            }
        }
    }
    Ok(())
}

/// The file runs of a block, in output order. `shape` and `ranges` are in
/// elements of `bits` bits; sub-byte types are cut at whole bytes (checked
/// by the caller).
fn block_runs(shape: &[u64], bits: u64, ranges: &[(u64, u64)], data_start: u64) -> Vec<Run> {
    if ranges.iter().any(|&(lo, hi)| lo == hi) {
        return Vec::new();
    }
    let n = shape.len();
    // Bit strides, so two-per-byte types work out to whole bytes.
    let mut stride = vec![bits; n];
    for d in (0..n.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * shape[d + 1];
    }
    if n == 0 {
        return vec![Run {
            file_offset: data_start,
            len: (bits / 8) as usize,
        }];
    }
    // The innermost dimension that is narrowed: everything inside it is
    // whole, so it and they form one contiguous run per outer index.
    let k = (0..n)
        .rev()
        .find(|&d| ranges[d] != (0, shape[d]))
        .unwrap_or(0);
    let (lo_k, hi_k) = ranges[k];
    let run_len = ((hi_k - lo_k) * stride[k] / 8) as usize;
    let mut runs = Vec::new();
    let mut index: Vec<u64> = ranges[..k].iter().map(|&(lo, _)| lo).collect();
    loop {
        let bit_offset: u64 =
            index.iter().zip(&stride).map(|(i, s)| i * s).sum::<u64>() + lo_k * stride[k];
        let run = Run {
            file_offset: data_start + bit_offset / 8,
            len: run_len,
        };
        // Whole outer rows back to back merge into one run.
        match runs.last_mut() {
            Some(Run { file_offset, len }) if *file_offset + *len as u64 == run.file_offset => {
                *len += run.len
            }
            _ => runs.push(run),
        }
        // Odometer over the outer dimensions.
        let mut d = k;
        loop {
            if d == 0 {
                return runs;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < ranges[d].1 {
                break;
            }
            index[d] = ranges[d].0;
        }
    }
}

#[cfg(test)]
mod tests;
