//! The inode table a listing becomes: directories and files, inode numbers in listing
//! order, and what each file's open handles and streams are.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::{MountOptions, ROOT_INO};
use crate::backend::{Entry, Perm};
use crate::streams::Streams;

/// A file's open handles: the kernel keeps one I/O mode per inode, so a file is either
/// read through the mount (cached) or passed through, never both at once.
#[derive(Default)]
pub(super) struct Opens {
    pub(super) cached: usize,
    pub(super) backed: usize,
}

pub(super) struct FileNode {
    pub(super) entry: Entry,
    pub(super) streams: Mutex<Streams>,
    pub(super) opens: Mutex<Opens>,
    pub(super) safetensors: bool,
    /// Position among the `.safetensors` files, for lookahead.
    pub(super) shard_rank: Option<usize>,
    pub(super) looked_ahead: AtomicBool,
}

pub(super) enum Node {
    Dir {
        children: BTreeMap<String, u64>,
        perm: Option<Perm>,
    },
    File(FileNode),
}

/// The inode table of a listing: the root first, then directories and files in listing
/// order; and the `.safetensors` files' inodes in that order. A name that is both a file
/// and a directory (an object `x` beside `x/y`, or a folder marker) is served as the
/// directory: an empty object (a folder marker) is dropped quietly, any other logged.
pub(super) fn tree(listed: Vec<Entry>, opts: &MountOptions) -> (Vec<Node>, Vec<u64>) {
    let mut nodes = vec![Node::Dir {
        children: BTreeMap::new(),
        perm: None,
    }];
    // Every directory path, with the first listed path that makes it one.
    let mut dirs: std::collections::HashMap<String, String> = Default::default();
    let mut usable = Vec::with_capacity(listed.len());
    for entry in listed {
        if entry.path.is_empty() {
            if entry.is_dir {
                if let Node::Dir { perm, .. } = &mut nodes[0] {
                    *perm = entry.perm;
                }
            } else {
                tracing::warn!("skipping a file with an empty name");
            }
            continue;
        }
        let parts: Vec<&str> = entry.path.split('/').collect();
        if parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
        {
            tracing::warn!(path = %entry.path, "skipping a name no file system can hold");
            continue;
        }
        let upto = if entry.is_dir {
            parts.len()
        } else {
            parts.len() - 1
        };
        for i in 1..=upto {
            dirs.entry(parts[..i].join("/"))
                .or_insert_with(|| entry.path.clone());
        }
        usable.push(entry);
    }
    let mut shards = Vec::new();
    for entry in usable {
        if !entry.is_dir {
            if let Some(by) = dirs.get(&entry.path) {
                if entry.size == 0 {
                    tracing::debug!(path = %entry.path, "an empty object named as a directory (a folder marker): serving the directory");
                } else {
                    tracing::warn!(file = %entry.path, directory_of = %by, "a file and a directory share a name: serving the directory, skipping the file");
                }
                continue;
            }
        }
        let parts: Vec<&str> = entry.path.split('/').collect();
        let (name, parents) = parts.split_last().expect("split gives one part at least");
        let mut dir = ROOT_INO;
        for part in parents {
            dir = child_dir(&mut nodes, dir, part);
        }
        if entry.is_dir {
            let ino = child_dir(&mut nodes, dir, name);
            if let Node::Dir { perm, .. } = &mut nodes[(ino - 1) as usize] {
                *perm = entry.perm;
            }
            continue;
        }
        let ino = nodes.len() as u64 + 1;
        let Node::Dir { children, .. } = &mut nodes[(dir - 1) as usize] else {
            continue; // (child_dir gives directories)
        };
        if children.contains_key(*name) {
            tracing::warn!(path = %entry.path, "skipping a file listed twice");
            continue;
        }
        children.insert(name.to_string(), ino);
        let safetensors = name.ends_with(".safetensors");
        if safetensors {
            shards.push(ino);
        }
        nodes.push(Node::File(FileNode {
            streams: Mutex::new(Streams::new(opts.streams, opts.block_bytes)),
            opens: Mutex::new(Opens::default()),
            safetensors,
            shard_rank: safetensors.then(|| shards.len() - 1),
            looked_ahead: AtomicBool::new(false),
            entry,
        }));
    }
    (nodes, shards)
}

/// The directory `name` in directory `parent`, made if new. Never a file: a file is only
/// added under a name no directory has.
fn child_dir(nodes: &mut Vec<Node>, parent: u64, name: &str) -> u64 {
    let next = nodes.len() as u64 + 1;
    if let Node::Dir { children, .. } = &mut nodes[(parent - 1) as usize] {
        if let Some(&ino) = children.get(name) {
            return ino;
        }
        children.insert(name.to_string(), next);
    }
    nodes.push(Node::Dir {
        children: BTreeMap::new(),
        perm: None,
    });
    next
}
