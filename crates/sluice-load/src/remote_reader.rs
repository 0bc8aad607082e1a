//! Checkpoints in object stores (`s3://`, `gs://`, `az://`): the headers, read with two
//! small ranged GETs per shard, into the same [`Checkpoint`] a local one gives (its paths
//! are the object URLs), each shard's bytes a [`RemoteObject`] pinned to the ETag the
//! header was read from (docs/design/remote.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_formats::{
    parse_header, parse_header_len, parse_index, Checkpoint, CheckpointSource, Shard,
};
use sluice_remote::{ObjectInfo, ObjectUrl, RemoteError, RemoteOptions, RemoteStore};

use crate::checkpoint_reader::{
    missing_in_series, warn_missing, CheckpointFiles, ReadOptions, INDEX_FILE_NAME,
};
use crate::error::LoadError;
use crate::shard_file::{RemoteObject, ShardFile};

/// Largest index JSON read whole.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Whether `path` names an object in a store rather than a local file.
pub fn is_remote(path: &str) -> bool {
    ObjectUrl::is_url(path)
}

/// The checkpoint at `url` (one `.safetensors` object, an index JSON, or a prefix holding
/// shards, with an index or without) with a reader per shard, each pinned to the version
/// its header was read from.
pub(crate) fn open_remote_files(
    url: &str,
    opts: &RemoteOptions,
    options: ReadOptions,
) -> Result<CheckpointFiles<ShardFile>, LoadError> {
    let url = ObjectUrl::parse(url)?;
    let store = Arc::new(RemoteStore::open(&url, opts)?);
    open_remote_in(&store, &url, options)
}

/// The checkpoint at `url` in `store` (any `ObjectStore` behind it: tests use an in-memory
/// one behind a fault-injecting double). As for a local directory, a prefix holds the
/// objects directly under it (not those under a deeper prefix), and a shard its index or
/// its `-NNNNN-of-MMMMM` name promises but the store lacks is an error unless
/// `allow_partial`.
pub(crate) fn open_remote_in(
    store: &Arc<RemoteStore>,
    url: &ObjectUrl,
    options: ReadOptions,
) -> Result<CheckpointFiles<ShardFile>, LoadError> {
    let found = open_remote(store, url, options)?;
    warn_missing(&found.missing);
    Ok(found)
}

fn open_remote(
    store: &Arc<RemoteStore>,
    url: &ObjectUrl,
    options: ReadOptions,
) -> Result<CheckpointFiles<ShardFile>, LoadError> {
    let store = Arc::clone(store);
    let url = url.clone();
    let key = url.key.trim_end_matches('/');
    if key.ends_with(".json") {
        return read_indexed(&store, &url, options);
    }
    if key.ends_with(".safetensors") {
        let (shard, file) = read_shard(&store, store.info(&url)?)?;
        return Ok(CheckpointFiles {
            checkpoint: Checkpoint::from_shards(source_file(&url), vec![shard])?,
            files: vec![file],
            missing: Vec::new(),
        });
    }
    let (listed, deeper) = store.list_dir(&url)?;
    if listed.is_empty() && deeper == 0 {
        // Nothing at all under it: a missing "directory", as a local path would be.
        return Err(RemoteError::NotFound {
            url: url.to_string(),
            what: "prefix (no objects under it)",
        }
        .into());
    }
    if let Some(index) = listed
        .iter()
        .find(|o| o.url.key.rsplit('/').next() == Some(INDEX_FILE_NAME))
    {
        return read_indexed(&store, &index.url, options);
    }
    let objects: Vec<ObjectInfo> = listed
        .into_iter()
        .filter(|o| o.url.key.ends_with(".safetensors"))
        .collect();
    let dir = PathBuf::from(url.to_string().trim_end_matches('/'));
    if objects.is_empty() {
        return Err(LoadError::NoShards { dir });
    }
    let names: Vec<PathBuf> = objects
        .iter()
        .map(|o| PathBuf::from(o.url.to_string()))
        .collect();
    let missing = missing_in_series(&dir, &names);
    if !missing.is_empty() && !options.allow_partial {
        return Err(LoadError::ShardsMissing { dir, missing });
    }
    let (shards, files) = read_shards(&store, objects)?;
    Ok(CheckpointFiles {
        checkpoint: Checkpoint::from_shards(CheckpointSource::Directory(dir), shards)?,
        files,
        missing,
    })
}

fn source_file(url: &ObjectUrl) -> CheckpointSource {
    CheckpointSource::File(PathBuf::from(url.to_string()))
}

fn read_indexed(
    store: &Arc<RemoteStore>,
    index: &ObjectUrl,
    options: ReadOptions,
) -> Result<CheckpointFiles<ShardFile>, LoadError> {
    let info = store.info(index)?;
    let shown = PathBuf::from(index.to_string());
    if info.size > MAX_INDEX_BYTES {
        return Err(LoadError::config(
            index.to_string(),
            format!(
                "an index of {} bytes (at most {MAX_INDEX_BYTES})",
                info.size
            ),
        ));
    }
    let mut json = vec![0u8; info.size as usize];
    store.read_ranges(&info, vec![(0, &mut json)])?;
    let mut parsed = parse_index(&shown, &json)?;
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
    let mut names = parsed.shard_names();
    names.sort();
    // An absent shard is an error naming it, or with `allow_partial` left out with
    // the tensors the index puts in it.
    let found = parallel(&names, |name| match store.info(&dir.join(name)) {
        Ok(info) => Ok(Some(info)),
        Err(RemoteError::NotFound { .. }) if options.allow_partial => Ok(None),
        Err(e) => Err(e),
    })?;
    let mut objects = Vec::with_capacity(names.len());
    let mut missing = Vec::new();
    for (name, info) in names.iter().zip(found) {
        match info {
            Some(info) => objects.push(info),
            None => {
                parsed.weight_map.retain(|_, shard| shard != name);
                missing.push(PathBuf::from(dir.join(name).to_string()));
            }
        }
    }
    let (shards, files) = read_shards(store, objects)?;
    Ok(CheckpointFiles {
        checkpoint: Checkpoint::from_index(&shown, &parsed, shards)?,
        files,
        missing,
    })
}

/// Headers read from every shard at once, so planning costs a round trip or two, not
/// two per shard.
fn read_shards(
    store: &Arc<RemoteStore>,
    objects: Vec<ObjectInfo>,
) -> Result<(Vec<Shard>, Vec<ShardFile>), LoadError> {
    Ok(parallel(&objects, |o| read_shard(store, o.clone()))?
        .into_iter()
        .unzip())
}

/// Most header reads in flight at once.
const HEADER_READS: usize = 16;

/// `f` over `items` on up to [`HEADER_READS`] threads, results in order; the first error wins.
fn parallel<T: Sync, R: Send, E: Send>(
    items: &[T],
    f: impl Fn(&T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let per = items.len().div_ceil(HEADER_READS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|part| scope.spawn(|| part.iter().map(&f).collect::<Result<Vec<R>, E>>()))
            .collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            match h.join() {
                Ok(part) => out.extend(part?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(out)
    })
}

/// Bytes read with a shard's first GET: most headers fit, so one round trip reads them.
const FIRST_READ: u64 = 64 << 10;

/// One shard's header: the first [`FIRST_READ`] bytes in one ranged GET, and the rest of
/// the header in a second where it is longer.
fn read_shard(store: &Arc<RemoteStore>, obj: ObjectInfo) -> Result<(Shard, ShardFile), LoadError> {
    let shown = PathBuf::from(obj.url.to_string());
    let path: &Path = &shown;
    let mut head = vec![0u8; FIRST_READ.min(obj.size) as usize];
    store.read_ranges(&obj, vec![(0, &mut head)])?;
    let header_len = parse_header_len(path, &head[..8.min(head.len())], obj.size)?;
    let end = 8 + header_len as usize;
    if end > head.len() {
        let at = head.len();
        head.resize(end, 0);
        store.read_ranges(&obj, vec![(at as u64, &mut head[at..])])?;
    }
    let header = parse_header(path, &head[8..end], obj.size)?;
    let shard = Shard {
        path: shown,
        file_len: obj.size,
        header,
    };
    let file = ShardFile::Remote(Arc::new(RemoteObject::new(Arc::clone(store), obj)));
    Ok((shard, file))
}
