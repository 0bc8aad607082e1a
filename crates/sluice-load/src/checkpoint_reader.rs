//! Finding and parsing a checkpoint on disk: a single `.safetensors` file, a
//! `model.safetensors.index.json`, or a directory (its index if present,
//! otherwise every `*.safetensors` in name order).
//!
//! Only headers are read here (8 bytes plus the JSON), with plain reads;
//! the bulk data goes through the engines.

use std::io::Read;
use std::path::{Path, PathBuf};

use sluice_formats::{
    parse_header, parse_header_len, parse_index, Checkpoint, CheckpointSource, Shard, PREFIX_BYTES,
};

use crate::error::LoadError;

/// The index file name Hugging Face checkpoints use.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";

/// Opens and fully validates the checkpoint at `path`.
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint, LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::io(path, "open", e))?;
    if meta.is_dir() {
        let index = path.join(INDEX_FILE_NAME);
        if index.is_file() {
            return read_indexed(&index);
        }
        return read_directory(path);
    }
    if path.extension().is_some_and(|e| e == "json") {
        return read_indexed(path);
    }
    let shard = read_shard(path)?;
    Ok(Checkpoint::from_shards(
        CheckpointSource::File(path.to_path_buf()),
        vec![shard],
    )?)
}

fn read_directory(dir: &Path) -> Result<Checkpoint, LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| LoadError::io(dir, "list", e))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LoadError::io(dir, "list", e))?;
        let path = entry.path();
        // Every `*.safetensors` entry counts, whatever it is: a FIFO, a
        // directory or a dangling link under that name is an error naming
        // it (read_shard), never a shard silently left out of the load.
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
    let shards = files
        .iter()
        .map(|f| read_shard(f))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checkpoint::from_shards(
        CheckpointSource::Directory(dir.to_path_buf()),
        shards,
    )?)
}

fn read_indexed(index_path: &Path) -> Result<Checkpoint, LoadError> {
    let json = read_regular(index_path)?;
    let index = parse_index(index_path, &json)?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut names = index.shard_names();
    // Shard file names carry their order (model-00001-of-00004...); reading
    // them in that order keeps the disk sequential.
    names.sort();
    let mut shards = Vec::new();
    for name in names {
        let path = dir.join(&name);
        if !path.exists() {
            return Err(LoadError::ShardFileMissing {
                index: index_path.to_path_buf(),
                shard: name,
                path,
            });
        }
        shards.push(read_shard(&path)?);
    }
    Ok(Checkpoint::from_index(index_path, &index, shards)?)
}

/// Reads and validates one shard's header.
pub fn read_shard(path: &Path) -> Result<Shard, LoadError> {
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
    Ok(Shard {
        path: path.to_path_buf(),
        file_len,
        header,
    })
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
