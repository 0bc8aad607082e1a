//! [`Share`]: one rank's state hashed into chunks, what a save plans with and writes from.
//!
//! The front end describes each entry of the state ([`EntryHead`]: key, kind, dtype,
//! shape, size, front-end meta) and where its bytes are: host memory it keeps alive and
//! unchanged until the save is staged, or *streamed* (a device tensor whose bytes come
//! through a host window, hashed window by window with [`Share::hash_window`]).
//!
//! Entries are cut into `chunk_bytes` chunks named by their digest. Host entries smaller
//! than [`pack_below`] bytes get no chunks of their own: they are copied, in key order,
//! into packs of up to `chunk_bytes`, and each pack is one chunk. A state of 55,000 small
//! tensors (norms, biases, scalars) then writes a few files instead of 55,000; replicated
//! small tensors still deduplicate across data-parallel ranks, whose packs are identical.
//!
//! What travels to the other ranks is the [`ShareTable`] (heads and chunk references, no
//! bytes) in a compact binary form ([`ShareTable::encode`]): rank 0 plans who writes what
//! from every rank's table and publishes a manifest built from them
//! ([`manifest_of`]).

use serde::{Deserialize, Serialize};

use crate::chunking::{hash_all, ChunkRef, Digest};
use crate::error::CkptError;
use crate::manifest::{Entry, EntryKind, Manifest, PackRef, VERSION};

/// An entry as the front end describes it, without its bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryHead {
    pub key: String,
    pub kind: EntryKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    pub nbytes: u64,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub meta: serde_json::Value,
}

/// Where an entry's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Chunks `first..first + count` of the table's `chunks` (none for an empty entry).
    Chunks { first: u32, count: u32 },
    /// `nbytes` bytes at `offset` in pack `pack` of the table's `packs`; `bytes_digest`
    /// names those bytes alone.
    Packed {
        pack: u32,
        offset: u64,
        bytes_digest: Digest,
    },
}

/// Host entries below this size are packed: a sixty-fourth of a chunk, at most 64 KiB. A
/// pack of 4 MiB then holds at least 64 of them, and an entry large enough to be worth a
/// file of its own (and its own dedup) keeps one.
pub fn pack_below(chunk_bytes: u64) -> u64 {
    (chunk_bytes / 64).clamp(1, 64 << 10)
}

/// One rank's entries and the chunks that hold them: what the other ranks see.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShareTable {
    pub chunk_bytes: u64,
    pub heads: Vec<EntryHead>,
    pub layouts: Vec<Layout>,
    /// Whole chunks of chunked entries, in entry order (repeats kept: a tied weight).
    pub chunks: Vec<ChunkRef>,
    /// Packs of small entries.
    pub packs: Vec<ChunkRef>,
}

/// Where an entry's bytes come from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// Host memory at this address, alive and unchanged until the save is staged.
    Host(usize),
    /// Bytes that come later through a window ([`Share::hash_window`], then pushes).
    Streamed,
}

/// A rank's hashed state: its table, where each entry's bytes are, and the packs' bytes.
pub struct Share {
    table: ShareTable,
    sources: Vec<Source>,
    /// The bytes of each pack, owned here until the save's writes are staged.
    pack_bytes: Vec<Vec<u8>>,
    /// Streamed chunks not hashed yet.
    unhashed: usize,
}

/// A chunk this rank writes from host memory: its bytes are at the address.
pub type HostTask = (ChunkRef, usize);

/// A chunk this rank writes whose bytes are streamed: entry `entry`, from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamedTask {
    pub chunk: ChunkRef,
    pub entry: usize,
    pub offset: u64,
}

impl Share {
    /// Hashes a rank's entries. `sources[i]` is where entry `i`'s `heads[i].nbytes` bytes
    /// are; streamed entries get their digests from [`Share::hash_window`].
    ///
    /// # Safety
    /// Every `Source::Host(addr)` must point at `nbytes` readable bytes that stay alive and
    /// unchanged until this share's writes are staged (the front end keeps its tensors).
    pub unsafe fn hash(
        heads: Vec<EntryHead>,
        sources: Vec<Source>,
        chunk_bytes: u64,
        threads: usize,
    ) -> Result<Share, CkptError> {
        if chunk_bytes == 0 || chunk_bytes > u32::MAX as u64 {
            return Err(CkptError::arg(
                "chunk_bytes",
                format!("{chunk_bytes}: must be 1 byte to 4 GiB"),
            ));
        }
        if heads.len() != sources.len() {
            return Err(CkptError::arg(
                "sources",
                format!("{} for {} entries", sources.len(), heads.len()),
            ));
        }
        let small = pack_below(chunk_bytes);
        let mut layouts = Vec::with_capacity(heads.len());
        let mut pack_bytes: Vec<Vec<u8>> = Vec::new();
        // (entry, byte range in it) of every whole chunk, in entry order.
        let mut pieces: Vec<(usize, u64, u64)> = Vec::new();
        let mut unhashed = 0;
        for (i, (h, src)) in heads.iter().zip(&sources).enumerate() {
            let first = pieces.len() as u32;
            match *src {
                Source::Host(addr) if h.nbytes > 0 && h.nbytes < small => {
                    let fits = pack_bytes
                        .last()
                        .is_some_and(|p| p.len() as u64 + h.nbytes <= chunk_bytes);
                    if !fits {
                        pack_bytes.push(Vec::with_capacity(chunk_bytes as usize));
                    }
                    let pack_index = (pack_bytes.len() - 1) as u32;
                    let pack = pack_bytes.last_mut().expect("pushed above");
                    // SAFETY: the caller's contract: `nbytes` readable bytes at `addr`.
                    let bytes = unsafe { region(addr, h.nbytes) };
                    layouts.push(Layout::Packed {
                        pack: pack_index,
                        offset: pack.len() as u64,
                        bytes_digest: Digest::of(bytes),
                    });
                    pack.extend_from_slice(bytes);
                    continue;
                }
                Source::Streamed => unhashed += h.nbytes.div_ceil(chunk_bytes) as usize,
                Source::Host(_) => {}
            }
            let mut at = 0;
            while at < h.nbytes {
                let n = chunk_bytes.min(h.nbytes - at);
                pieces.push((i, at, n));
                at += n;
            }
            layouts.push(Layout::Chunks {
                first,
                count: pieces.len() as u32 - first,
            });
        }
        // Host chunks and packs are hashed together, in parallel across all of them.
        let host: Vec<&[u8]> = pieces
            .iter()
            .filter_map(|&(i, at, n)| match sources[i] {
                // SAFETY: as above; `at + n <= nbytes`.
                Source::Host(addr) => Some(unsafe { region(addr + at as usize, n) }),
                Source::Streamed => None,
            })
            .chain(pack_bytes.iter().map(Vec::as_slice))
            .collect();
        let mut digests = hash_all(&host, threads).into_iter();
        let mut chunks = Vec::with_capacity(pieces.len());
        for &(i, _, n) in &pieces {
            let digest = match sources[i] {
                Source::Host(_) => digests.next().expect("one digest a host piece"),
                Source::Streamed => Digest([0; 32]), // filled by hash_window
            };
            chunks.push(ChunkRef { digest, len: n });
        }
        let packs = pack_bytes
            .iter()
            .map(|p| ChunkRef {
                digest: digests.next().expect("one digest a pack"),
                len: p.len() as u64,
            })
            .collect();
        Ok(Share {
            table: ShareTable {
                chunk_bytes,
                heads,
                layouts,
                chunks,
                packs,
            },
            sources,
            pack_bytes,
            unhashed,
        })
    }

    /// Hashes `bytes`, the streamed entry `entry`'s bytes from `offset` (a multiple of
    /// `chunk_bytes`; a window of whole chunks, or the entry's tail).
    pub fn hash_window(
        &mut self,
        entry: usize,
        offset: u64,
        bytes: &[u8],
        threads: usize,
    ) -> Result<(), CkptError> {
        let cb = self.table.chunk_bytes;
        let head = self
            .table
            .heads
            .get(entry)
            .ok_or_else(|| CkptError::arg(format!("entry {entry}"), "is not in the share"))?;
        let (first, count) = match (self.sources[entry], self.table.layouts[entry]) {
            (Source::Streamed, Layout::Chunks { first, count }) => (first, count),
            _ => {
                return Err(CkptError::arg(
                    format!("entry {:?}", head.key),
                    "is not streamed",
                ))
            }
        };
        let end = offset + bytes.len() as u64;
        if offset % cb != 0 || end > head.nbytes || (end % cb != 0 && end != head.nbytes) {
            return Err(CkptError::arg(
                format!("entry {:?}", head.key),
                format!(
                    "a window of bytes {offset}..{end} of {}: windows hold whole \
                     {cb}-byte chunks",
                    head.nbytes
                ),
            ));
        }
        let pieces: Vec<&[u8]> = bytes.chunks(cb as usize).collect();
        let at = first as usize + (offset / cb) as usize;
        for (k, d) in hash_all(&pieces, threads).into_iter().enumerate() {
            debug_assert!(at + k < (first + count) as usize);
            let c = &mut self.table.chunks[at + k];
            if c.digest == Digest([0; 32]) {
                self.unhashed -= 1;
            }
            c.digest = d;
        }
        Ok(())
    }

    /// The table the other ranks see; every streamed chunk must be hashed by now.
    pub fn table(&self) -> Result<&ShareTable, CkptError> {
        if self.unhashed > 0 {
            return Err(CkptError::arg(
                "share",
                format!("{} streamed chunks were never hashed", self.unhashed),
            ));
        }
        Ok(&self.table)
    }

    /// The chunks this rank writes, given the plan's indices into its
    /// [`ShareTable::holdings`]: host ones with their source address (an entry's memory,
    /// or a pack owned here), streamed ones with their entry and offset.
    pub fn tasks(&self, indices: &[u32]) -> Result<(Vec<HostTask>, Vec<StreamedTask>), CkptError> {
        let mut host = Vec::new();
        let mut streamed = Vec::new();
        let owner = self.chunk_owners();
        let n_chunks = self.table.chunks.len();
        for &i in indices {
            let i = i as usize;
            if i >= n_chunks {
                let p = i - n_chunks;
                let bytes = self.pack_bytes.get(p).ok_or_else(|| {
                    CkptError::arg(
                        "write plan",
                        format!("index {i} is past this rank's chunks"),
                    )
                })?;
                host.push((self.table.packs[p], bytes.as_ptr() as usize));
                continue;
            }
            let (entry, k) = owner[i];
            let c = self.table.chunks[i];
            let offset = k as u64 * self.table.chunk_bytes;
            match self.sources[entry] {
                Source::Host(addr) => host.push((c, addr + offset as usize)),
                Source::Streamed => streamed.push(StreamedTask {
                    chunk: c,
                    entry,
                    offset,
                }),
            }
        }
        Ok((host, streamed))
    }

    /// For each whole chunk, its entry and its place within the entry.
    fn chunk_owners(&self) -> Vec<(usize, u32)> {
        let mut out = vec![(0, 0); self.table.chunks.len()];
        for (e, l) in self.table.layouts.iter().enumerate() {
            if let Layout::Chunks { first, count } = *l {
                for k in 0..count {
                    out[(first + k) as usize] = (e, k);
                }
            }
        }
        out
    }
}

/// The bytes at `addr..addr + len` (empty for `len == 0`, whatever `addr`).
///
/// # Safety
/// For `len > 0`, the range must be readable memory that outlives the slice.
unsafe fn region<'a>(addr: usize, len: u64) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }
}

impl ShareTable {
    /// Every chunk this rank holds, whole chunks then packs (repeats kept): what the write
    /// planner sees, and what its indices point into.
    pub fn holdings(&self) -> Vec<ChunkRef> {
        self.chunks.iter().chain(&self.packs).copied().collect()
    }

    /// The chunks at `indices` of [`ShareTable::holdings`] (a rank's planned share).
    pub fn assigned(&self, indices: &[u32]) -> Result<Vec<ChunkRef>, CkptError> {
        let all = self.holdings();
        indices
            .iter()
            .map(|&i| {
                all.get(i as usize).copied().ok_or_else(|| {
                    CkptError::arg("write plan", format!("index {i} is past the rank's chunks"))
                })
            })
            .collect()
    }

    /// The table with only the entries whose key `keep` accepts, and the chunks and
    /// packs they use.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) -> ShareTable {
        let mut out = ShareTable {
            chunk_bytes: self.chunk_bytes,
            ..ShareTable::default()
        };
        let mut packs: std::collections::HashMap<u32, u32> = Default::default();
        for (h, l) in self.heads.iter().zip(&self.layouts) {
            if !keep(&h.key) {
                continue;
            }
            out.heads.push(h.clone());
            out.layouts.push(match *l {
                Layout::Chunks { first, count } => {
                    let at = out.chunks.len() as u32;
                    let range = first as usize..(first + count) as usize;
                    out.chunks.extend_from_slice(&self.chunks[range]);
                    Layout::Chunks { first: at, count }
                }
                Layout::Packed {
                    pack,
                    offset,
                    bytes_digest,
                } => {
                    let next = out.packs.len() as u32;
                    let p = *packs.entry(pack).or_insert(next);
                    if p == next {
                        out.packs.push(self.packs[pack as usize]);
                    }
                    Layout::Packed {
                        pack: p,
                        offset,
                        bytes_digest,
                    }
                }
            });
        }
        out
    }

    /// Bytes of every entry (duplicates counted).
    pub fn logical_bytes(&self) -> u64 {
        self.heads.iter().map(|h| h.nbytes).sum()
    }

    /// The compact form that travels between ranks: the heads as JSON, then the layouts
    /// and chunk references as fixed-size binary records (40 bytes a chunk).
    pub fn encode(&self) -> Vec<u8> {
        let heads = serde_json::to_vec(&self.heads).expect("heads always serialize");
        let mut out = Vec::with_capacity(64 + heads.len() + 40 * self.chunks.len());
        out.extend_from_slice(TABLE_MAGIC);
        out.extend_from_slice(&self.chunk_bytes.to_le_bytes());
        out.extend_from_slice(&(heads.len() as u64).to_le_bytes());
        out.extend_from_slice(&heads);
        for l in &self.layouts {
            let (tag, a, b, d) = match *l {
                Layout::Chunks { first, count } => (0u8, first, count as u64, None),
                Layout::Packed {
                    pack,
                    offset,
                    bytes_digest,
                } => (1u8, pack, offset, Some(bytes_digest)),
            };
            out.push(tag);
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
            if let Some(d) = d {
                out.extend_from_slice(&d.0);
            }
        }
        for list in [&self.chunks, &self.packs] {
            out.extend_from_slice(&(list.len() as u64).to_le_bytes());
            for c in list {
                out.extend_from_slice(&c.digest.0);
                out.extend_from_slice(&c.len.to_le_bytes());
            }
        }
        out
    }

    /// Decodes [`ShareTable::encode`]'s bytes, checking every reference (`rank` names the
    /// table's sender in errors).
    pub fn decode(bytes: &[u8], rank: usize) -> Result<ShareTable, CkptError> {
        let bad = |detail: &str| CkptError::arg(format!("rank {rank}'s chunk table"), detail);
        let mut r = Reader { bytes, at: 0 };
        if r.take(TABLE_MAGIC.len()).ok_or_else(|| bad("is empty"))? != TABLE_MAGIC {
            return Err(bad("is not a sluice.ckpt chunk table"));
        }
        let chunk_bytes = r.u64().ok_or_else(|| bad("ends early"))?;
        let n = r.u64().ok_or_else(|| bad("ends early"))?;
        let json = r.take(n as usize).ok_or_else(|| bad("ends early"))?;
        let heads: Vec<EntryHead> =
            serde_json::from_slice(json).map_err(|e| bad(&format!("entries: {e}")))?;
        let mut layouts = Vec::with_capacity(heads.len());
        for _ in 0..heads.len() {
            let tag = r.take(1).ok_or_else(|| bad("ends early"))?[0];
            let a = r.u32().ok_or_else(|| bad("ends early"))?;
            let b = r.u64().ok_or_else(|| bad("ends early"))?;
            layouts.push(match tag {
                0 => Layout::Chunks {
                    first: a,
                    count: u32::try_from(b).map_err(|_| bad("a chunk count is too large"))?,
                },
                1 => Layout::Packed {
                    pack: a,
                    offset: b,
                    bytes_digest: Digest(
                        r.take(32)
                            .ok_or_else(|| bad("ends early"))?
                            .try_into()
                            .expect("32 bytes"),
                    ),
                },
                _ => return Err(bad("an entry has an unknown layout")),
            });
        }
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            let n = r.u64().ok_or_else(|| bad("ends early"))? as usize;
            if n > bytes.len() / 40 {
                return Err(bad("counts more chunks than it holds"));
            }
            for _ in 0..n {
                let d = r.take(32).ok_or_else(|| bad("ends early"))?;
                let len = r.u64().ok_or_else(|| bad("ends early"))?;
                list.push(ChunkRef {
                    digest: Digest(d.try_into().expect("32 bytes")),
                    len,
                });
            }
        }
        if r.at != bytes.len() {
            return Err(bad("has trailing bytes"));
        }
        let [chunks, packs] = lists;
        let t = ShareTable {
            chunk_bytes,
            heads,
            layouts,
            chunks,
            packs,
        };
        t.check().map_err(|d| bad(&d))?;
        Ok(t)
    }

    /// Every layout within the table's chunks and packs, every size adding up.
    pub fn check(&self) -> Result<(), String> {
        for (h, l) in self.heads.iter().zip(&self.layouts) {
            match *l {
                Layout::Chunks { first, count } => {
                    let range = first as usize..first as usize + count as usize;
                    let Some(cs) = self.chunks.get(range) else {
                        return Err(format!("entry {:?} points past the chunks", h.key));
                    };
                    if cs.iter().map(|c| c.len).sum::<u64>() != h.nbytes {
                        return Err(format!("entry {:?}: chunks and size differ", h.key));
                    }
                }
                Layout::Packed { pack, offset, .. } => {
                    let fits = self
                        .packs
                        .get(pack as usize)
                        .is_some_and(|p| offset.checked_add(h.nbytes).is_some_and(|e| e <= p.len));
                    if !fits {
                        return Err(format!("entry {:?} points past its pack", h.key));
                    }
                }
            }
        }
        Ok(())
    }
}

const TABLE_MAGIC: &[u8] = b"SLCKTAB1";

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(out)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
}

/// The manifest of a save from every rank's table. An entry key two ranks (or one rank
/// twice) use is refused, naming it.
pub fn manifest_of(
    tables: &[ShareTable],
    world_size: u32,
    chunk_bytes: u64,
) -> Result<Manifest, CkptError> {
    let mut m = Manifest::new(chunk_bytes, world_size);
    for (rank, t) in tables.iter().enumerate() {
        for (h, l) in t.heads.iter().zip(&t.layouts) {
            let (chunks, pack) = match *l {
                Layout::Chunks { first, count } => {
                    let range = first as usize..(first + count) as usize;
                    (t.chunks[range].to_vec(), None)
                }
                Layout::Packed {
                    pack,
                    offset,
                    bytes_digest,
                } => {
                    let p = t.packs[pack as usize];
                    m.packs.insert(p.digest, p.len);
                    let at = PackRef {
                        digest: p.digest,
                        offset,
                        bytes_digest,
                    };
                    (Vec::new(), Some(at))
                }
            };
            let entry = Entry {
                kind: h.kind,
                dtype: h.dtype.clone(),
                shape: h.shape.clone(),
                nbytes: h.nbytes,
                chunks,
                pack,
                meta: h.meta.clone(),
            };
            if m.entries.insert(h.key.clone(), entry).is_some() {
                return Err(CkptError::arg(
                    format!("entry {:?}", h.key),
                    format!("is saved twice (rank {rank} saves it again)"),
                ));
            }
        }
    }
    if !m.packs.is_empty() {
        m.version = VERSION;
    }
    m.check()
        .map_err(|detail| CkptError::arg("checkpoint", detail))?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(key: &str, nbytes: u64) -> EntryHead {
        EntryHead {
            key: key.into(),
            kind: EntryKind::Tensor,
            dtype: Some("uint8".into()),
            shape: Some(vec![nbytes]),
            nbytes,
            meta: serde_json::Value::Null,
        }
    }

    fn share(entries: &[(&str, &[u8])], chunk: u64) -> Share {
        let heads = entries
            .iter()
            .map(|(k, b)| head(k, b.len() as u64))
            .collect();
        let sources = entries
            .iter()
            .map(|(_, b)| Source::Host(b.as_ptr() as usize))
            .collect();
        // SAFETY: the entries outlive the share in every test.
        unsafe { Share::hash(heads, sources, chunk, 2) }.unwrap()
    }

    #[test]
    fn small_entries_share_packs_and_large_ones_get_chunks() {
        let big = vec![7u8; 10_000];
        let (a, b) = ([1u8; 10], [2u8; 20]);
        let s = share(&[("a", &a), ("big", &big), ("b", &b), ("e", &[])], 4096);
        let t = s.table().unwrap();
        assert_eq!(t.packs.len(), 1);
        assert_eq!(t.packs[0].len, 30);
        assert_eq!(t.packs[0].digest, Digest::of(&[&a[..], &b[..]].concat()));
        let packed = |offset, bytes: &[u8]| Layout::Packed {
            pack: 0,
            offset,
            bytes_digest: Digest::of(bytes),
        };
        assert_eq!(t.layouts[0], packed(0, &a));
        assert_eq!(t.layouts[2], packed(10, &b));
        assert_eq!(t.layouts[1], Layout::Chunks { first: 0, count: 3 });
        assert_eq!(t.layouts[3], Layout::Chunks { first: 3, count: 0 });
        let back = ShareTable::decode(&t.encode(), 0).unwrap();
        assert_eq!(&back, t);
        // The plan's indices: chunks first, then packs.
        let (host, streamed) = s.tasks(&[0, 3]).unwrap();
        assert!(streamed.is_empty());
        assert_eq!(host[0].1, big.as_ptr() as usize);
        assert_eq!(host[1].0, t.packs[0]);
    }

    #[test]
    fn packs_fill_to_a_chunk_and_start_anew() {
        let small: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 60]).collect();
        let entries: Vec<(String, &[u8])> = small
            .iter()
            .enumerate()
            .map(|(i, b)| (format!("e{i}"), b.as_slice()))
            .collect();
        let refs: Vec<(&str, &[u8])> = entries.iter().map(|(k, b)| (k.as_str(), *b)).collect();
        let s = share(&refs, 64 * 100); // packs below 100 bytes, of up to 6400
        let t = s.table().unwrap();
        assert_eq!(t.packs.iter().map(|p| p.len).sum::<u64>(), 6000);
        assert!(t.packs.iter().all(|p| p.len <= 6400));
    }

    #[test]
    fn streamed_entries_are_hashed_window_by_window() {
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let heads = vec![head("d", bytes.len() as u64)];
        // SAFETY: no host source.
        let mut s = unsafe { Share::hash(heads, vec![Source::Streamed], 4096, 2) }.unwrap();
        assert!(s.table().is_err(), "not hashed yet");
        assert!(
            s.hash_window(0, 100, &bytes[100..4196], 2).is_err(),
            "unaligned"
        );
        s.hash_window(0, 0, &bytes[..8192], 2).unwrap();
        s.hash_window(0, 8192, &bytes[8192..], 2).unwrap();
        let t = s.table().unwrap();
        assert_eq!(t.chunks[2].digest, Digest::of(&bytes[8192..]));
        let (host, streamed) = s.tasks(&[1]).unwrap();
        assert!(host.is_empty());
        assert_eq!(streamed[0].offset, 4096);
    }

    #[test]
    fn damaged_tables_are_refused_naming_the_rank() {
        let a = [1u8; 5000];
        let s = share(&[("a", &a)], 4096);
        let bytes = s.table().unwrap().encode();
        for cut in [0, 3, 20, bytes.len() - 1] {
            let e = ShareTable::decode(&bytes[..cut], 3)
                .unwrap_err()
                .to_string();
            assert!(e.contains("rank 3"), "{e}");
        }
        let mut t = s.table().unwrap().clone();
        t.layouts[0] = Layout::Chunks { first: 1, count: 2 };
        assert!(ShareTable::decode(&t.encode(), 0).is_err());
    }
}
