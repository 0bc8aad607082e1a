//! Finding and parsing a checkpoint on disk: a single `.safetensors` file, a
//! `model.safetensors.index.json`, or a directory (its index if present,
//! otherwise every `*.safetensors` in name order).
//!
//! Only headers are read here (8 bytes plus the JSON), with plain reads;
//! the bulk data goes through the engines. A missing shard is an error unless
//! the caller asks for a partial load: a directory whose names say
//! `-00002-of-00002` but lack that file, or an index naming a file that is
//! not there.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sluice_formats::{
    parse_header, parse_header_len, parse_index, Checkpoint, CheckpointSource, Shard, PREFIX_BYTES,
};

use crate::error::LoadError;

/// The index file name Hugging Face checkpoints use.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// How strictly a checkpoint must be complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Load what is there when shards are absent: an index's shard file that
    /// does not exist, or a gap in a directory's `-NNNNN-of-MMMMM` series.
    /// Off by default: a missing shard is an error, never a smaller model.
    pub allow_partial: bool,
}

/// A validated checkpoint with the descriptors its headers were read from,
/// so later reads see exactly the files that were validated.
#[derive(Debug)]
pub struct CheckpointFiles<F = File> {
    pub checkpoint: Checkpoint,
    /// One per shard, in the checkpoint's shard order.
    pub files: Vec<F>,
    /// Shard files that are absent (only with `allow_partial`).
    pub missing: Vec<PathBuf>,
}

/// Opens and fully validates the checkpoint at `path`; every shard must be present.
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint, LoadError> {
    Ok(open_checkpoint_files(path, ReadOptions::default())?.checkpoint)
}

/// Opens and validates the checkpoint at `path` (a file, an index, or a
/// directory: its index if present, otherwise every `*.safetensors`), keeping
/// each shard's descriptor open.
pub fn open_checkpoint_files(
    path: &Path,
    options: ReadOptions,
) -> Result<CheckpointFiles, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, "open", e))?;
    let found = if meta.is_dir() {
        let index = path.join(INDEX_FILE_NAME);
        if index.is_file() {
            read_indexed(&index, options)?
        } else {
            read_directory(path, options)?
        }
    } else if path.extension().is_some_and(|e| e == "json") {
        read_indexed(path, options)?
    } else {
        let (shard, file) = open_shard(path)?;
        let checkpoint =
            Checkpoint::from_shards(CheckpointSource::File(path.to_path_buf()), vec![shard])?;
        CheckpointFiles {
            checkpoint,
            files: vec![file],
            missing: Vec::new(),
        }
    };
    warn_missing(&found.missing);
    Ok(found)
}

/// One warning per absent shard a partial load leaves out, for the first few; one line for
/// the rest (a name promising 99,999 shards must not print 99,998 lines).
pub(crate) fn warn_missing(missing: &[PathBuf]) {
    const SHOWN: usize = 8;
    for shard in missing.iter().take(SHOWN) {
        tracing::warn!(shard = %shard.display(), "shard absent; loading the rest (allow_partial)");
    }
    if missing.len() > SHOWN {
        tracing::warn!(
            "and {} more shards absent (last_load_stats()['missing_shards'] lists them all)",
            missing.len() - SHOWN
        );
    }
}

fn read_directory(dir: &Path, options: ReadOptions) -> Result<CheckpointFiles, LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::io(dir, "list", e))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LoadError::io(dir, "list", e))?;
        let path = entry.path();
        // Every `*.safetensors` entry counts, whatever it is: a FIFO, a
        // directory or a dangling link under that name is an error naming
        // it (open_shard), never a shard silently left out of the load.
        if path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(LoadError::NoShards {
            dir: dir.to_path_buf(),
        });
    }
    files.sort();
    let missing = missing_in_series(dir, &files);
    if !missing.is_empty() && !options.allow_partial {
        return Err(LoadError::ShardsMissing {
            dir: dir.to_path_buf(),
            missing,
        });
    }
    let (shards, handles) = open_shards(&files)?;
    Ok(CheckpointFiles {
        checkpoint: Checkpoint::from_shards(
            CheckpointSource::Directory(dir.to_path_buf()),
            shards,
        )?,
        files: handles,
        missing,
    })
}

/// `(prefix, number, total, digits of total)` of a Hugging Face shard name
/// such as `model-00002-of-00004.safetensors`.
fn series_position(path: &Path) -> Option<(String, u64, u64, usize)> {
    let stem = path.file_stem()?.to_str()?;
    let (head, total) = stem.rsplit_once("-of-")?;
    let (prefix, number) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(number) || !digits(total) {
        return None;
    }
    Some((
        prefix.to_string(),
        number.parse().ok()?,
        total.parse().ok()?,
        total.len(),
    ))
}

/// The shard files a directory's names promise but do not contain: for each
/// `<prefix>-NNNNN-of-MMMMM` series, every number from 1 to M must be there.
pub(crate) fn missing_in_series(dir: &Path, files: &[PathBuf]) -> Vec<PathBuf> {
    let mut series: BTreeMap<(String, u64), (BTreeSet<u64>, usize)> = BTreeMap::new();
    for file in files {
        if let Some((prefix, number, total, width)) = series_position(file) {
            let entry = series.entry((prefix, total)).or_default();
            entry.0.insert(number);
            entry.1 = width;
        }
    }
    let mut missing = Vec::new();
    for ((prefix, total), (present, width)) in &series {
        // A total of 0 or one in the millions is not a series anyone wrote.
        if *total == 0 || *total > 100_000 {
            continue;
        }
        for n in 1..=*total {
            if !present.contains(&n) {
                missing.push(dir.join(format!(
                    "{prefix}-{n:0width$}-of-{total:0width$}.safetensors"
                )));
            }
        }
    }
    missing
}

fn read_indexed(index_path: &Path, options: ReadOptions) -> Result<CheckpointFiles, LoadError> {
    let json = read_regular(index_path)?;
    let mut index = parse_index(index_path, &json)?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut names = index.shard_names();
    // Shard file names carry their order (model-00001-of-00004...); reading
    // them in that order keeps the disk sequential.
    names.sort();
    let mut missing = Vec::new();
    let mut present = Vec::new();
    for name in names {
        let path = dir.join(&name);
        // symlink_metadata: a dangling link is there, and fails to open
        // with an error naming it rather than counting as absent.
        if std::fs::symlink_metadata(&path).is_ok() {
            present.push(path);
            continue;
        }
        if !options.allow_partial {
            return Err(LoadError::ShardFileMissing {
                index: index_path.to_path_buf(),
                shard: name,
                path,
            });
        }
        index.weight_map.retain(|_, shard| *shard != name);
        missing.push(path);
    }
    let (shards, files) = open_shards(&present)?;
    Ok(CheckpointFiles {
        checkpoint: Checkpoint::from_index(index_path, &index, shards)?,
        files,
        missing,
    })
}

fn open_shards(paths: &[PathBuf]) -> Result<(Vec<Shard>, Vec<File>), LoadError> {
    let mut shards = Vec::with_capacity(paths.len());
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let (shard, file) = open_shard(path)?;
        shards.push(shard);
        files.push(file);
    }
    Ok((shards, files))
}

/// Reads and validates one shard's header.
pub fn read_shard(path: &Path) -> Result<Shard, LoadError> {
    Ok(open_shard(path)?.0)
}

/// Reads and validates one shard's header, returning the open descriptor too.
fn open_shard(path: &Path) -> Result<(Shard, File), LoadError> {
    let mut file =
        sluice_engine::open_regular(path, 0).map_err(|e| LoadError::io(path, "open", e))?;
    let file_len = file
        .metadata()
        .map_err(|e| LoadError::io(path, "stat", e))?
        .len();
    let mut prefix = Vec::with_capacity(PREFIX_BYTES as usize);
    (&mut file)
        .take(PREFIX_BYTES)
        .read_to_end(&mut prefix)
        .map_err(|e| LoadError::io(path, "read", e))?;
    let header_len = parse_header_len(path, &prefix, file_len)?;
    let mut json = Vec::new();
    (&mut file)
        .take(header_len)
        .read_to_end(&mut json)
        .map_err(|e| LoadError::io(path, "read", e))?;
    if (json.len() as u64) < header_len {
        return Err(LoadError::Truncated {
            path: path.to_path_buf(),
            offset: PREFIX_BYTES,
            expected: header_len,
            got: json.len() as u64,
        });
    }
    let header = parse_header(path, &json, file_len)?;
    let shard = Shard {
        path: path.to_path_buf(),
        file_len,
        header,
    };
    Ok((shard, file))
}

/// The whole of a small file (an index), refusing FIFOs and other
/// non-regular files instead of blocking on them.
fn read_regular(path: &Path) -> Result<Vec<u8>, LoadError> {
    let mut file =
        sluice_engine::open_regular(path, 0).map_err(|e| LoadError::io(path, "open", e))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| LoadError::io(path, "read", e))?;
    Ok(bytes)
}
