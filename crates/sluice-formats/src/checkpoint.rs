//! Assembling validated shards into one checkpoint description.
//!
//! A checkpoint comes from a single `.safetensors` file, a directory of them, or a
//! `model.safetensors.index.json`. The caller opens the files and parses each header; this
//! module checks that the pieces agree, so a loader never has to wonder which copy of a
//! tensor is the real one:
//!
//! - every checkpoint has at least one shard, and no shard is listed twice;
//! - a tensor name appears in exactly one shard (both files are named otherwise);
//! - for an index: every shard it names was supplied and every supplied shard is named;
//!   every tensor it lists is in the shard it says; and no shard holds a tensor the index
//!   does not list, which would otherwise be loaded or skipped depending on the reader.
//!
//! Index shard names are matched to supplied shards by path: first exactly against
//! `<index dir>/<name>`, then, to tolerate callers that canonicalised paths, by a path that
//! ends with `<name>` when exactly one shard does.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::FormatError;
use crate::header::Header;
use crate::index::ShardIndex;
use crate::tensor_info::TensorInfo;

/// One `.safetensors` file and its validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub path: PathBuf,
    pub file_len: u64,
    pub header: Header,
}

/// Where a checkpoint was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointSource {
    /// A single `.safetensors` file.
    File(PathBuf),
    /// A directory of `.safetensors` files without an index.
    Directory(PathBuf),
    /// A `model.safetensors.index.json`.
    Index(PathBuf),
}

impl CheckpointSource {
    /// The file or directory the checkpoint was found at.
    pub fn path(&self) -> &Path {
        match self {
            CheckpointSource::File(path)
            | CheckpointSource::Directory(path)
            | CheckpointSource::Index(path) => path,
        }
    }
}

/// A validated multi-shard checkpoint: every tensor name lives in exactly one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub source: CheckpointSource,
    /// Shards in the order the caller supplied them.
    pub shards: Vec<Shard>,
}

impl Checkpoint {
    /// A checkpoint from a single file or a directory: tensors must be unique across
    /// shards.
    pub fn from_shards(
        source: CheckpointSource,
        shards: Vec<Shard>,
    ) -> Result<Checkpoint, FormatError> {
        if shards.is_empty() {
            let file = source.path().to_path_buf();
            return Err(FormatError::NoShards { file });
        }
        check_distinct_paths(&shards)?;
        locate_tensors(&shards)?;
        Ok(Checkpoint { source, shards })
    }

    /// A checkpoint from an index: shards and tensors must match the index exactly.
    pub fn from_index(
        index_path: &Path,
        index: &ShardIndex,
        shards: Vec<Shard>,
    ) -> Result<Checkpoint, FormatError> {
        let shard_of_name = resolve_shard_names(index_path, index, &shards)?;
        if shards.is_empty() {
            let file = index_path.to_path_buf();
            return Err(FormatError::NoShards { file });
        }
        check_distinct_paths(&shards)?;
        check_all_shards_named(index_path, &shards, &shard_of_name)?;
        let located = locate_tensors(&shards)?;
        check_index_tensors(index_path, index, &shards, &shard_of_name, &located)?;
        check_no_unlisted_tensors(index_path, index, &shards)?;
        let source = CheckpointSource::Index(index_path.to_path_buf());
        Ok(Checkpoint { source, shards })
    }

    /// Number of tensors across all shards.
    pub fn tensor_count(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.header.tensors.len())
            .sum()
    }

    /// Total tensor bytes across all shards.
    pub fn total_bytes(&self) -> u64 {
        self.shards.iter().fold(0u64, |total, shard| {
            total.saturating_add(shard.header.total_tensor_bytes())
        })
    }

    /// The shard index and description of tensor `name`. A linear scan; use
    /// [`Checkpoint::tensor_locations`] for many lookups.
    pub fn find(&self, name: &str) -> Option<(usize, &TensorInfo)> {
        self.tensors().find(|(_, tensor)| tensor.name == name)
    }

    /// Every tensor with the index of its shard, shard by shard in offset order.
    pub fn tensors(&self) -> impl Iterator<Item = (usize, &TensorInfo)> + '_ {
        self.shards.iter().enumerate().flat_map(|(index, shard)| {
            shard
                .header
                .tensors
                .iter()
                .map(move |tensor| (index, tensor))
        })
    }

    /// A name → (shard index, tensor) map for repeated lookups.
    pub fn tensor_locations(&self) -> HashMap<&str, (usize, &TensorInfo)> {
        self.tensors()
            .map(|(index, tensor)| (tensor.name.as_str(), (index, tensor)))
            .collect()
    }
}

fn check_distinct_paths(shards: &[Shard]) -> Result<(), FormatError> {
    let mut seen = HashSet::with_capacity(shards.len());
    match shards
        .iter()
        .find(|shard| !seen.insert(shard.path.as_path()))
    {
        Some(shard) => Err(FormatError::DuplicateShard {
            file: shard.path.clone(),
        }),
        None => Ok(()),
    }
}

/// Maps every tensor name to its shard, refusing names found in two shards.
fn locate_tensors(shards: &[Shard]) -> Result<HashMap<&str, usize>, FormatError> {
    let mut located: HashMap<&str, usize> = HashMap::new();
    for (index, shard) in shards.iter().enumerate() {
        for tensor in &shard.header.tensors {
            if let Some(&first) = located.get(tensor.name.as_str()) {
                return Err(FormatError::DuplicateTensorAcrossShards {
                    file: shards[first].path.clone(),
                    tensor: tensor.name.clone(),
                    other_file: shard.path.clone(),
                });
            }
            located.insert(tensor.name.as_str(), index);
        }
    }
    Ok(located)
}

/// Finds the supplied shard for every shard name in the index.
fn resolve_shard_names<'i>(
    index_path: &Path,
    index: &'i ShardIndex,
    shards: &[Shard],
) -> Result<HashMap<&'i str, usize>, FormatError> {
    let index_dir = index_path.parent().unwrap_or(Path::new(""));
    let mut resolved = HashMap::new();
    for name in index.weight_map.values() {
        if resolved.contains_key(name.as_str()) {
            continue;
        }
        let Some(shard) = match_shard(index_dir, name, shards) else {
            let (file, shard) = (index_path.to_path_buf(), name.clone());
            return Err(FormatError::ShardMissing { file, shard });
        };
        resolved.insert(name.as_str(), shard);
    }
    Ok(resolved)
}

fn match_shard(index_dir: &Path, name: &str, shards: &[Shard]) -> Option<usize> {
    let expected = index_dir.join(name);
    if let Some(exact) = shards.iter().position(|shard| shard.path == expected) {
        return Some(exact);
    }
    let mut suffix_matches = shards
        .iter()
        .enumerate()
        .filter(|(_, shard)| shard.path.ends_with(name))
        .map(|(position, _)| position);
    match (suffix_matches.next(), suffix_matches.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

fn check_all_shards_named(
    index_path: &Path,
    shards: &[Shard],
    shard_of_name: &HashMap<&str, usize>,
) -> Result<(), FormatError> {
    let named: HashSet<usize> = shard_of_name.values().copied().collect();
    match (0..shards.len()).find(|position| !named.contains(position)) {
        Some(position) => Err(FormatError::ShardNotInIndex {
            file: index_path.to_path_buf(),
            shard: shards[position].path.clone(),
        }),
        None => Ok(()),
    }
}

/// Every tensor the index lists must be in the shard it names.
fn check_index_tensors(
    index_path: &Path,
    index: &ShardIndex,
    shards: &[Shard],
    shard_of_name: &HashMap<&str, usize>,
    located: &HashMap<&str, usize>,
) -> Result<(), FormatError> {
    for (tensor, shard_name) in &index.weight_map {
        let expected = shard_of_name.get(shard_name.as_str()).copied();
        match located.get(tensor.as_str()).copied() {
            Some(actual) if Some(actual) == expected => {}
            Some(actual) => {
                return Err(FormatError::TensorInWrongShard {
                    file: index_path.to_path_buf(),
                    tensor: tensor.clone(),
                    expected_shard: shard_name.clone(),
                    actual_shard: shards[actual].path.clone(),
                })
            }
            None => {
                return Err(FormatError::TensorMissingFromShard {
                    file: index_path.to_path_buf(),
                    tensor: tensor.clone(),
                    shard: shard_name.clone(),
                })
            }
        }
    }
    Ok(())
}

/// No shard may hold a tensor the index does not list.
fn check_no_unlisted_tensors(
    index_path: &Path,
    index: &ShardIndex,
    shards: &[Shard],
) -> Result<(), FormatError> {
    for shard in shards {
        let unlisted = shard
            .header
            .tensors
            .iter()
            .find(|tensor| !index.weight_map.contains_key(&tensor.name));
        if let Some(tensor) = unlisted {
            return Err(FormatError::TensorNotInIndex {
                file: shard.path.clone(),
                tensor: tensor.name.clone(),
                index: index_path.to_path_buf(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::dtype::Dtype;

    const INDEX: &str = "ckpt/model.safetensors.index.json";

    /// A shard at `path` holding one 4-byte F32 scalar per name, laid out back to back.
    fn shard(path: &str, names: &[&str]) -> Shard {
        let tensors: Vec<TensorInfo> = names
            .iter()
            .zip(0u64..)
            .map(|(name, i)| TensorInfo {
                name: name.to_string(),
                dtype: Dtype::F32,
                shape: vec![],
                start: i * 4,
                end: i * 4 + 4,
            })
            .collect();
        let data_len = tensors.len() as u64 * 4;
        Shard {
            path: PathBuf::from(path),
            file_len: 16 + data_len,
            header: Header {
                header_len: 8,
                data_start: 16,
                data_len,
                tensors,
                metadata: None,
            },
        }
    }

    fn index(entries: &[(&str, &str)]) -> ShardIndex {
        let weight_map: BTreeMap<String, String> = entries
            .iter()
            .map(|(t, s)| (t.to_string(), s.to_string()))
            .collect();
        ShardIndex {
            metadata: None,
            weight_map,
        }
    }

    fn from_index(entries: &[(&str, &str)], shards: Vec<Shard>) -> Result<Checkpoint, FormatError> {
        Checkpoint::from_index(Path::new(INDEX), &index(entries), shards)
    }

    #[test]
    fn directory_checkpoint_counts_and_finds_tensors() {
        let source = CheckpointSource::Directory(PathBuf::from("ckpt"));
        let shards = vec![
            shard("ckpt/a.safetensors", &["x", "y"]),
            shard("ckpt/b.safetensors", &["z"]),
        ];
        let checkpoint = Checkpoint::from_shards(source, shards).unwrap();
        assert_eq!(checkpoint.tensor_count(), 3);
        assert_eq!(checkpoint.total_bytes(), 12);
        assert_eq!(
            checkpoint.find("z").map(|(i, t)| (i, t.start)),
            Some((1, 0))
        );
        assert_eq!(checkpoint.find("nope"), None);
        assert_eq!(checkpoint.tensor_locations().len(), 3);
        assert_eq!(checkpoint.source.path(), Path::new("ckpt"));
    }

    #[test]
    fn rejects_checkpoint_without_shards() {
        let source = CheckpointSource::Directory(PathBuf::from("empty"));
        let err = Checkpoint::from_shards(source, vec![]).unwrap_err();
        assert!(matches!(err, FormatError::NoShards { .. }), "{err}");
        let err = from_index(&[], vec![]).unwrap_err();
        assert!(matches!(err, FormatError::NoShards { .. }), "{err}");
    }

    #[test]
    fn rejects_the_same_shard_twice() {
        let source = CheckpointSource::File(PathBuf::from("a.safetensors"));
        let shards = vec![
            shard("a.safetensors", &["x"]),
            shard("a.safetensors", &["y"]),
        ];
        let err = Checkpoint::from_shards(source, shards).unwrap_err();
        assert!(matches!(err, FormatError::DuplicateShard { .. }), "{err}");
    }

    #[test]
    fn rejects_tensor_in_two_shards_and_names_both_files() {
        let source = CheckpointSource::Directory(PathBuf::from("d"));
        let shards = vec![
            shard("d/a.safetensors", &["x"]),
            shard("d/b.safetensors", &["w", "x"]),
        ];
        let err = Checkpoint::from_shards(source, shards).unwrap_err();
        let FormatError::DuplicateTensorAcrossShards {
            file,
            tensor,
            other_file,
        } = &err
        else {
            panic!("expected duplicate, got {err}");
        };
        assert_eq!(tensor, "x");
        assert_eq!(file, Path::new("d/a.safetensors"));
        assert_eq!(other_file, Path::new("d/b.safetensors"));
    }

    #[test]
    fn index_checkpoint_accepts_consistent_shards() {
        let shards = vec![
            shard("ckpt/a.safetensors", &["x"]),
            shard("ckpt/b.safetensors", &["y"]),
        ];
        let checkpoint =
            from_index(&[("x", "a.safetensors"), ("y", "b.safetensors")], shards).unwrap();
        assert_eq!(
            checkpoint.source,
            CheckpointSource::Index(PathBuf::from(INDEX))
        );
        assert_eq!(checkpoint.tensor_count(), 2);
    }

    #[test]
    fn index_shards_match_canonicalised_paths_by_suffix() {
        let shards = vec![shard("/abs/ckpt/sub/a.safetensors", &["x"])];
        assert!(from_index(&[("x", "sub/a.safetensors")], shards).is_ok());
    }

    #[test]
    fn rejects_shard_named_by_index_but_not_supplied() {
        let shards = vec![shard("ckpt/a.safetensors", &["x"])];
        let err =
            from_index(&[("x", "a.safetensors"), ("y", "b.safetensors")], shards).unwrap_err();
        assert!(
            matches!(&err, FormatError::ShardMissing { shard, .. } if shard == "b.safetensors"),
            "{err}"
        );
    }

    #[test]
    fn rejects_supplied_shard_the_index_does_not_name() {
        let shards = vec![
            shard("ckpt/a.safetensors", &["x"]),
            shard("ckpt/extra.safetensors", &[]),
        ];
        let err = from_index(&[("x", "a.safetensors")], shards).unwrap_err();
        assert!(
            matches!(&err, FormatError::ShardNotInIndex { shard, .. } if shard == Path::new("ckpt/extra.safetensors")),
            "{err}"
        );
    }

    #[test]
    fn rejects_index_tensor_that_no_shard_holds() {
        let shards = vec![shard("ckpt/a.safetensors", &["x"])];
        let err =
            from_index(&[("x", "a.safetensors"), ("gone", "a.safetensors")], shards).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorMissingFromShard { tensor, shard, .. } if tensor == "gone" && shard == "a.safetensors"),
            "{err}"
        );
    }

    #[test]
    fn rejects_index_tensor_found_in_a_different_shard() {
        let shards = vec![
            shard("ckpt/a.safetensors", &["x"]),
            shard("ckpt/b.safetensors", &["y"]),
        ];
        let err =
            from_index(&[("x", "b.safetensors"), ("y", "a.safetensors")], shards).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorInWrongShard { tensor, actual_shard, .. }
                if tensor == "x" && actual_shard == Path::new("ckpt/a.safetensors")),
            "{err}"
        );
    }

    #[test]
    fn rejects_tensor_in_two_shards_of_an_indexed_checkpoint() {
        let shards = vec![
            shard("ckpt/a.safetensors", &["x"]),
            shard("ckpt/b.safetensors", &["x"]),
        ];
        let err =
            from_index(&[("x", "a.safetensors"), ("z", "b.safetensors")], shards).unwrap_err();
        assert!(
            matches!(err, FormatError::DuplicateTensorAcrossShards { .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_shard_tensor_missing_from_the_index() {
        let shards = vec![shard("ckpt/a.safetensors", &["x", "stray"])];
        let err = from_index(&[("x", "a.safetensors")], shards).unwrap_err();
        assert!(
            matches!(&err, FormatError::TensorNotInIndex { file, tensor, .. }
                if tensor == "stray" && file == Path::new("ckpt/a.safetensors")),
            "{err}"
        );
    }
}
