//! [`Fetch`]: what one rank reads for a load, and the grouped read plan.
//!
//! A load names its destinations: each entry it wants and the host memory to fill. A
//! [`Fetch`] turns them into the distinct chunks the rank needs and where each lands: in
//! the first destination that holds it (other places get a copy after), or for a pack of
//! small entries, in a scratch buffer the entries are copied out of.
//!
//! In a group, every rank's needs are pooled and [`ReadPlan::new`] picks one reader per
//! chunk among the ranks that need it, balancing the bytes each reads (largest chunks
//! first, each to the needer with the least so far). The reader reads and verifies the
//! chunk, then sends it to the other needers: [`Fetch::transfers`] lists this rank's
//! sends and receives in one order every rank derives alike, so the front end can post
//! them as one batch of point-to-point operations.

use std::collections::HashMap;

use crate::chunking::{ChunkRef, Digest, DigestBuild};
use crate::error::CkptError;
use crate::manifest::Manifest;
use crate::store::CkptStore;

/// Where a needed chunk's bytes land.
#[derive(Clone, Copy, Debug)]
enum Landing {
    /// At this address of a destination.
    At(usize),
    /// In scratch buffer `i` (a pack).
    Scratch(usize),
}

/// One distinct chunk this rank needs.
struct Need {
    chunk: ChunkRef,
    /// The first entry that needs it, for messages.
    entry: String,
    landing: Landing,
    /// (offset in the chunk, destination address, bytes) copied out once it has landed.
    copies: Vec<(u64, usize, u64)>,
}

/// One point-to-point transfer of a grouped load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// `true`: send this rank's copy to `peer`; `false`: receive it from `peer`.
    pub send: bool,
    pub peer: usize,
    pub addr: usize,
    pub len: u64,
}

/// What a load read and received.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetchReport {
    pub read_bytes: u64,
    pub received_bytes: u64,
    pub chunks_read: usize,
}

/// One rank's part of a load.
pub struct Fetch {
    needs: Vec<Need>,
    index: HashMap<Digest, usize, DigestBuild>,
    scratch: Vec<Vec<u8>>,
    report: FetchReport,
}

// SAFETY: the addresses are destinations the caller keeps alive and reserved for the
// fetch (`Fetch::new`'s contract); nothing here is tied to a thread.
unsafe impl Send for Fetch {}

impl Fetch {
    /// The chunks that fill `dests` — (entry, address, bytes) — from `manifest`. `where_`
    /// names the checkpoint in errors.
    ///
    /// # Safety
    /// Each destination must be `bytes` of writable memory, no two overlapping, alive and
    /// touched by no one else until the fetch is dropped.
    pub unsafe fn new(
        manifest: &Manifest,
        dests: &[(String, usize, u64)],
        where_: &str,
    ) -> Result<Fetch, CkptError> {
        let mut f = Fetch {
            needs: Vec::new(),
            index: HashMap::default(),
            scratch: Vec::new(),
            report: FetchReport::default(),
        };
        for (key, addr, nbytes) in dests {
            let e = manifest.entries.get(key).ok_or_else(|| {
                CkptError::arg(
                    format!("{where_}: entry {key:?}"),
                    "is not in the checkpoint",
                )
            })?;
            if e.nbytes != *nbytes {
                return Err(CkptError::arg(
                    format!("{where_}: entry {key:?}"),
                    format!(
                        "the checkpoint holds {} bytes, the destination {nbytes}",
                        e.nbytes
                    ),
                ));
            }
            if let Some(p) = e.pack {
                let len = *manifest.packs.get(&p.digest).ok_or_else(|| {
                    CkptError::arg(
                        format!("{where_}: entry {key:?}"),
                        "names a pack not listed",
                    )
                })?;
                let i = f.need(
                    ChunkRef {
                        digest: p.digest,
                        len,
                    },
                    key,
                    None,
                );
                f.needs[i].copies.push((p.offset, *addr, *nbytes));
                continue;
            }
            let mut at = 0;
            for c in &e.chunks {
                f.need(*c, key, Some(addr + at));
                at += c.len as usize;
            }
        }
        Ok(f)
    }

    /// Records that `c` is needed at `addr` (a scratch buffer when `None`).
    fn need(&mut self, c: ChunkRef, entry: &str, addr: Option<usize>) -> usize {
        if let Some(&i) = self.index.get(&c.digest) {
            if let Some(a) = addr {
                self.needs[i].copies.push((0, a, c.len));
            }
            return i;
        }
        let landing = match addr {
            Some(a) => Landing::At(a),
            None => {
                self.scratch.push(vec![0u8; c.len as usize]);
                Landing::Scratch(self.scratch.len() - 1)
            }
        };
        self.needs.push(Need {
            chunk: c,
            entry: entry.to_string(),
            landing,
            copies: Vec::new(),
        });
        self.index.insert(c.digest, self.needs.len() - 1);
        self.needs.len() - 1
    }

    /// The distinct chunks this rank needs, by digest: what it tells the other ranks.
    pub fn needs(&self) -> Vec<ChunkRef> {
        let mut out: Vec<ChunkRef> = self.needs.iter().map(|n| n.chunk).collect();
        out.sort_by_key(|c| c.digest);
        out
    }

    fn landing_addr(&mut self, i: usize) -> usize {
        match self.needs[i].landing {
            Landing::At(a) => a,
            Landing::Scratch(s) => self.scratch[s].as_mut_ptr() as usize,
        }
    }

    /// Reads (and verifies) the chunks `plan` gives this rank, on `threads` threads.
    pub fn read(
        &mut self,
        store: &CkptStore,
        plan: &ReadPlan,
        rank: usize,
        threads: usize,
    ) -> Result<(), CkptError> {
        let mine: Vec<usize> = (0..self.needs.len())
            .filter(|&i| plan.reader(&self.needs[i].chunk.digest) == Some(rank))
            .filter(|&i| self.needs[i].chunk.len > 0)
            .collect();
        let addrs: Vec<usize> = mine.iter().map(|&i| self.landing_addr(i)).collect();
        let mut pieces = Vec::with_capacity(mine.len());
        for (&i, &addr) in mine.iter().zip(&addrs) {
            let n = &self.needs[i];
            // SAFETY: `Fetch::new`'s contract for destinations; scratch buffers are ours.
            // Distinct needs land in distinct places.
            let buf =
                unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n.chunk.len as usize) };
            pieces.push((n.chunk, n.entry.as_str(), buf));
        }
        store.read_chunks(pieces, threads)?;
        self.report.chunks_read = mine.len();
        self.report.read_bytes = mine.iter().map(|&i| self.needs[i].chunk.len).sum();
        Ok(())
    }

    /// This rank's sends and receives under `plan`, given every rank's needs: for each
    /// chunk in digest order, the reader sends to every other needer and each of those
    /// receives from it.
    pub fn transfers(
        &mut self,
        plan: &ReadPlan,
        all_needs: &[Vec<ChunkRef>],
        rank: usize,
    ) -> Vec<Transfer> {
        let mut out = Vec::new();
        for (digest, reader) in &plan.readers {
            let Some(&i) = self.index.get(digest) else {
                continue;
            };
            let len = self.needs[i].chunk.len;
            if len == 0 {
                continue;
            }
            let addr = self.landing_addr(i);
            if *reader == rank {
                for (peer, needs) in all_needs.iter().enumerate() {
                    let wants = needs.binary_search_by_key(digest, |c| c.digest).is_ok();
                    if peer != rank && wants {
                        out.push(Transfer {
                            send: true,
                            peer,
                            addr,
                            len,
                        });
                    }
                }
            } else {
                out.push(Transfer {
                    send: false,
                    peer: *reader,
                    addr,
                    len,
                });
                self.report.received_bytes += len;
            }
        }
        out
    }

    /// Copies every landed chunk to its other places. Call once every chunk has landed.
    pub fn finish(&mut self) -> FetchReport {
        for i in 0..self.needs.len() {
            let src = self.landing_addr(i);
            for &(off, dst, len) in &self.needs[i].copies {
                // SAFETY: `src + off .. + len` is inside the landed chunk (the manifest was
                // checked: packed entries fit their pack); `dst` is a destination of `len`
                // bytes (`Fetch::new`'s contract) distinct from the landing place.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        (src + off as usize) as *const u8,
                        dst as *mut u8,
                        len as usize,
                    )
                };
            }
        }
        self.report
    }
}

/// The reader of each chunk some rank needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadPlan {
    /// (chunk, reader rank), in digest order.
    readers: Vec<(Digest, usize)>,
}

impl ReadPlan {
    /// Plans a grouped read from every rank's needs (each sorted by digest): each chunk is
    /// read by one of its needers, balancing the bytes read (largest chunks first, each to
    /// the needer that has read least so far; ties to the lower rank). Every rank computes
    /// the same plan from the same needs.
    pub fn new(all_needs: &[Vec<ChunkRef>]) -> ReadPlan {
        let mut holders: HashMap<Digest, (u64, Vec<usize>), DigestBuild> = HashMap::default();
        for (r, needs) in all_needs.iter().enumerate() {
            for c in needs {
                holders
                    .entry(c.digest)
                    .or_insert((c.len, Vec::new()))
                    .1
                    .push(r);
            }
        }
        let mut order: Vec<(&Digest, &(u64, Vec<usize>))> = holders.iter().collect();
        order.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        let mut load = vec![0u64; all_needs.len()];
        let mut readers: Vec<(Digest, usize)> = order
            .into_iter()
            .map(|(d, (len, needers))| {
                let r = *needers
                    .iter()
                    .min_by_key(|r| (load[**r], **r))
                    .expect("a needed chunk has a needer");
                load[r] += len;
                (*d, r)
            })
            .collect();
        readers.sort_by_key(|(d, _)| *d);
        ReadPlan { readers }
    }

    /// Who reads `digest`.
    pub fn reader(&self, digest: &Digest) -> Option<usize> {
        self.readers
            .binary_search_by_key(digest, |(d, _)| *d)
            .ok()
            .map(|i| self.readers[i].1)
    }
}

/// A rank's needs in the compact form that travels between ranks (40 bytes a chunk).
pub fn encode_needs(needs: &[ChunkRef]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 * needs.len());
    for c in needs {
        out.extend_from_slice(&c.digest.0);
        out.extend_from_slice(&c.len.to_le_bytes());
    }
    out
}

/// Decodes [`encode_needs`] (`rank` names the sender in errors); the result is sorted.
pub fn decode_needs(bytes: &[u8], rank: usize) -> Result<Vec<ChunkRef>, CkptError> {
    if bytes.len() % 40 != 0 {
        return Err(CkptError::arg(
            format!("rank {rank}'s needs"),
            format!(
                "{} bytes is not a whole number of 40-byte records",
                bytes.len()
            ),
        ));
    }
    let mut out: Vec<ChunkRef> = bytes
        .chunks_exact(40)
        .map(|r| ChunkRef {
            digest: Digest(r[..32].try_into().expect("32 bytes")),
            len: u64::from_le_bytes(r[32..].try_into().expect("8 bytes")),
        })
        .collect();
    out.sort_by_key(|c| c.digest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(i: u8, len: u64) -> ChunkRef {
        ChunkRef {
            digest: Digest::of(&[i]),
            len,
        }
    }

    fn sorted(mut v: Vec<ChunkRef>) -> Vec<ChunkRef> {
        v.sort_by_key(|c| c.digest);
        v
    }

    #[test]
    fn each_chunk_is_read_once_by_a_needer_and_reads_balance() {
        // Both ranks need chunks 0..4 (replicated), rank 1 alone needs 5.
        let shared: Vec<ChunkRef> = (0..4).map(|i| c(i, 100)).collect();
        let r0 = sorted(shared.clone());
        let r1 = sorted([shared, vec![c(5, 100)]].concat());
        let plan = ReadPlan::new(&[r0.clone(), r1.clone()]);
        assert_eq!(plan.reader(&c(5, 100).digest), Some(1));
        let by0 = r0
            .iter()
            .filter(|x| plan.reader(&x.digest) == Some(0))
            .count();
        let by1 = r1
            .iter()
            .filter(|x| plan.reader(&x.digest) == Some(1))
            .count();
        assert_eq!(by0 + by1, 5);
        assert!(by0 >= 2 && by1 >= 2, "{by0} {by1}");
        // The same needs give the same plan (every rank computes it alone).
        assert_eq!(plan, ReadPlan::new(&[r0, r1]));
    }

    #[test]
    fn needs_round_trip_and_bad_ones_name_the_rank() {
        let needs = sorted(vec![c(1, 5), c(2, 7)]);
        assert_eq!(decode_needs(&encode_needs(&needs), 0).unwrap(), needs);
        let e = decode_needs(&[0u8; 41], 4).unwrap_err().to_string();
        assert!(e.contains("rank 4"), "{e}");
    }
}
