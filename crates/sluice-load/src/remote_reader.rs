//! Checkpoints in object stores (`s3://`, `gs://`, `az://`): the headers, read with two
//! small ranged GETs per shard, into the same [`Checkpoint`] a local one gives (its paths
//! are the object URLs). The first slice of issue 15: `sluice inspect` reads remote
//! checkpoints; loading tensors from them is the next (docs/design/remote.md).

use std::path::{Path, PathBuf};

use sluice_formats::{
    parse_header, parse_header_len, parse_index, Checkpoint, CheckpointSource, Shard,
};
use sluice_remote::{ObjectInfo, ObjectUrl, RemoteOptions, RemoteStore};

use crate::checkpoint_reader::INDEX_FILE_NAME;
use crate::error::LoadError;

/// Largest index JSON read whole.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Whether `path` names an object in a store rather than a local file.
pub fn is_remote(path: &str) -> bool {
    ObjectUrl::is_url(path)
}

/// The checkpoint at `url`: one `.safetensors` object, an index JSON, or a prefix holding
/// shards (with an index or without).
pub fn open_remote_checkpoint(url: &str) -> Result<Checkpoint, LoadError> {
    let url = ObjectUrl::parse(url)?;
    let store = RemoteStore::open(&url, &RemoteOptions::default())?;
    let key = url.key.trim_end_matches('/');
    if key.ends_with(".json") {
        return read_indexed(&store, &url);
    }
    if key.ends_with(".safetensors") {
        let shard = read_shard(&store, &store.info(&url)?)?;
        return Ok(Checkpoint::from_shards(source_file(&url), vec![shard])?);
    }
    let listed = store.list(&url)?;
    if let Some(index) = listed
        .iter()
        .find(|o| o.url.key.rsplit('/').next() == Some(INDEX_FILE_NAME))
    {
        return read_indexed(&store, &index.url);
    }
    let shards = listed
        .iter()
        .filter(|o| o.url.key.ends_with(".safetensors"))
        .map(|o| read_shard(&store, o))
        .collect::<Result<Vec<_>, _>>()?;
    if shards.is_empty() {
        return Err(LoadError::NoShards {
            dir: PathBuf::from(url.to_string()),
        });
    }
    Ok(Checkpoint::from_shards(
        CheckpointSource::Directory(PathBuf::from(url.to_string())),
        shards,
    )?)
}

fn source_file(url: &ObjectUrl) -> CheckpointSource {
    CheckpointSource::File(PathBuf::from(url.to_string()))
}

fn read_indexed(store: &RemoteStore, index: &ObjectUrl) -> Result<Checkpoint, LoadError> {
    let info = store.info(index)?;
    let shown = PathBuf::from(index.to_string());
    if info.size > MAX_INDEX_BYTES {
        return Err(LoadError::Config(format!(
            "{index}: an index of {} bytes (at most {MAX_INDEX_BYTES})",
            info.size
        )));
    }
    let mut json = vec![0u8; info.size as usize];
    store.read_ranges(&info, vec![(0, &mut json)])?;
    let parsed = parse_index(&shown, &json)?;
    let dir = match index.key.rsplit_once('/') {
        Some((d, _)) => ObjectUrl {
            key: d.to_string(),
            ..index.clone()
        },
        None => ObjectUrl {
            key: String::new(),
            ..index.clone()
        },
    };
    let shards = parsed
        .shard_names()
        .iter()
        .map(|name| read_shard(store, &store.info(&dir.join(name))?))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Checkpoint::from_shards(
        CheckpointSource::Index(shown),
        shards,
    )?)
}

/// One shard's header: the 8-byte length, then the JSON, each one ranged GET.
fn read_shard(store: &RemoteStore, obj: &ObjectInfo) -> Result<Shard, LoadError> {
    let shown = PathBuf::from(obj.url.to_string());
    let path: &Path = &shown;
    let mut prefix = vec![0u8; 8.min(obj.size) as usize];
    store.read_ranges(obj, vec![(0, &mut prefix)])?;
    let header_len = parse_header_len(path, &prefix, obj.size)?;
    let mut json = vec![0u8; header_len as usize];
    store.read_ranges(obj, vec![(8, &mut json)])?;
    let header = parse_header(path, &json, obj.size)?;
    Ok(Shard {
        path: shown,
        file_len: obj.size,
        header,
    })
}
