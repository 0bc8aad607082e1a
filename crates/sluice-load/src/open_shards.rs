//! A checkpoint wherever it lives: a local path goes to the local reader, an object URL
//! (`s3://`, `gs://`, `az://`) to the remote one; either way, a reader per shard.

use std::path::Path;

use sluice_remote::RemoteOptions;

use crate::checkpoint_reader::{open_checkpoint_files, CheckpointFiles, ReadOptions};
use crate::error::LoadError;
use crate::remote_reader::{is_remote, open_remote_files};
use crate::shard_file::ShardFile;

/// Opens and validates the checkpoint at `path`, local or an object URL
/// (`s3://`, `gs://`, `az://`), keeping a reader per shard.
pub fn open_shard_files(
    path: &Path,
    options: ReadOptions,
) -> Result<CheckpointFiles<ShardFile>, LoadError> {
    if let Some(url) = path.to_str().filter(|p| is_remote(p)) {
        return open_remote_files(url, &RemoteOptions::from_env()?, options);
    }
    let found = open_checkpoint_files(path, options)?;
    Ok(CheckpointFiles {
        checkpoint: found.checkpoint,
        files: found.files.into_iter().map(ShardFile::Local).collect(),
        missing: found.missing,
    })
}
