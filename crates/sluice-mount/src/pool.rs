//! [`BlockPool`]: one byte-budgeted cache of file blocks shared by every reader of a mount.
//!
//! A block is fetched once however many readers want it: the first claims it and fetches,
//! the others wait on the same [`Pending`]. The bytes held (ready blocks plus the
//! reservations of blocks being fetched) never exceed the budget. Demand reads wait for
//! room (backpressure); prefetch takes room only from blocks readers already used, and is
//! declined otherwise, so it never pushes out data a reader has yet to read.
//!
//! An evicted block's memory is kept for the next fetch (up to [`FREE_MAX`] buffers, outside
//! the budget) rather than unmapped: fresh memory must be zeroed and mapped by the kernel,
//! which cost the daemon more CPU than the bytes' own copies (docs/design/remote.md).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex};

use sluice_engine::AlignedBuf;

use crate::lock;

/// Evicted buffers kept for reuse, beyond the budget.
pub const FREE_MAX: usize = 4;

/// A block of a file: the file's index in the mount and the block number.
pub type BlockKey = (u64, u64);

/// A block's bytes, shared by the pool and every reader copying out of it.
pub type Block = Arc<AlignedBuf>;

/// How a fetch ended: the block's bytes, or its error's kind and message (an
/// `io::Error` cannot be cloned to every waiter).
type Outcome = Result<Block, (io::ErrorKind, String)>;

/// A fetch in progress; waiters block on it until the fetcher completes it.
#[derive(Default)]
pub struct Pending {
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
}

impl Pending {
    /// The block's bytes once fetched, or the fetch's error.
    pub fn wait(&self) -> io::Result<Block> {
        let mut outcome = lock(&self.outcome);
        loop {
            match &*outcome {
                Some(Ok(bytes)) => return Ok(Arc::clone(bytes)),
                Some(Err((kind, msg))) => return Err(io::Error::new(*kind, msg.clone())),
                None => outcome = self.done.wait(outcome).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    fn finish(&self, result: Outcome) {
        *lock(&self.outcome) = Some(result);
        self.done.notify_all();
    }
}

/// What a claim on a block found.
pub enum Claim {
    /// In the pool.
    Ready(Block),
    /// Being fetched by someone else: wait on it.
    Wait(Arc<Pending>),
    /// Yours to fetch; call [`BlockPool::complete`] with the result.
    Fetch(Arc<Pending>),
}

enum Slot {
    Loading(Arc<Pending>),
    Ready {
        bytes: Block,
        last_use: u64,
        /// A reader has read from it (prefetched blocks start unused).
        used: bool,
    },
}

struct Entry {
    slot: Slot,
    charge: u64,
}

#[derive(Default)]
struct State {
    blocks: HashMap<BlockKey, Entry>,
    held: u64,
    tick: u64,
    stats: PoolStats,
    /// Evicted blocks' buffers, no reader holding them, for the next fetches.
    free: Vec<AlignedBuf>,
}

/// Counters of a pool's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    pub held_bytes: u64,
    pub peak_bytes: u64,
    /// Demand reads served from a ready block.
    pub hits: u64,
    /// Demand reads that fetched or waited on a fetch.
    pub misses: u64,
    /// Blocks fetched (demand and prefetch).
    pub fetched_blocks: u64,
    pub fetched_bytes: u64,
    /// Prefetches declined for want of room.
    pub declined: u64,
    /// Blocks evicted before any reader used them.
    pub evicted_unused: u64,
    /// Fetches that reused an evicted block's memory.
    pub recycled: u64,
}

pub struct BlockPool {
    state: Mutex<State>,
    room: Condvar,
    budget: u64,
}

impl BlockPool {
    pub fn new(budget: u64) -> BlockPool {
        BlockPool {
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            budget,
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn stats(&self) -> PoolStats {
        let s = lock(&self.state);
        PoolStats {
            held_bytes: s.held,
            ..s.stats
        }
    }

    /// Memory for a block of `len` bytes: an evicted block's buffer of that size if one is
    /// kept (its old bytes are all overwritten by a fetch, or it is dropped), else a new one.
    pub fn buffer(&self, len: u64) -> std::io::Result<AlignedBuf> {
        {
            let mut s = lock(&self.state);
            if let Some(i) = s.free.iter().position(|b| b.len() as u64 == len) {
                s.stats.recycled += 1;
                return Ok(s.free.swap_remove(i));
            }
        }
        AlignedBuf::populated(len as usize)
    }

    /// Whether `key` is ready or being fetched.
    pub fn contains(&self, key: BlockKey) -> bool {
        lock(&self.state).blocks.contains_key(&key)
    }

    /// A demand read's claim on block `key` of `len` bytes: waits for room when the pool
    /// is full of blocks being fetched.
    pub fn claim(&self, key: BlockKey, len: u64) -> Claim {
        let mut s = lock(&self.state);
        loop {
            s.tick += 1;
            let tick = s.tick;
            if let Some(e) = s.blocks.get_mut(&key) {
                return match &mut e.slot {
                    Slot::Ready {
                        bytes,
                        last_use,
                        used,
                    } => {
                        *last_use = tick;
                        *used = true;
                        let bytes = Arc::clone(bytes);
                        s.stats.hits += 1;
                        Claim::Ready(bytes)
                    }
                    Slot::Loading(p) => {
                        let p = Arc::clone(p);
                        s.stats.misses += 1;
                        Claim::Wait(p)
                    }
                };
            }
            if make_room(&mut s, len, self.budget, true) {
                s.stats.misses += 1;
                return Claim::Fetch(insert_loading(&mut s, key, len));
            }
            s = self.room.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A prefetch's claim: `None` when the block is already there or being fetched, or
    /// when there is no room without evicting blocks no reader has used yet.
    pub fn claim_prefetch(&self, key: BlockKey, len: u64) -> Option<Arc<Pending>> {
        let mut s = lock(&self.state);
        if s.blocks.contains_key(&key) {
            return None;
        }
        if !make_room(&mut s, len, self.budget, false) {
            s.stats.declined += 1;
            return None;
        }
        Some(insert_loading(&mut s, key, len))
    }

    /// Ends the fetch of `key`: its bytes become a ready block (returned to the fetcher),
    /// or on error the claim is dropped (the next reader fetches again), every waiter gets
    /// the error, and the fetcher gets it back.
    pub fn complete(
        &self,
        key: BlockKey,
        pending: &Arc<Pending>,
        result: io::Result<AlignedBuf>,
    ) -> io::Result<Block> {
        let mut s = lock(&self.state);
        let ours = matches!(s.blocks.get(&key), Some(Entry { slot: Slot::Loading(p), .. }) if Arc::ptr_eq(p, pending));
        match result {
            Ok(bytes) => {
                let bytes: Block = Arc::new(bytes);
                s.stats.fetched_blocks += 1;
                s.stats.fetched_bytes += bytes.len() as u64;
                s.tick += 1;
                let tick = s.tick;
                if ours {
                    if let Some(e) = s.blocks.get_mut(&key) {
                        e.slot = Slot::Ready {
                            bytes: Arc::clone(&bytes),
                            last_use: tick,
                            used: false,
                        };
                    }
                }
                drop(s);
                // A ready block can be evicted, so a demand read waiting for room may go on.
                self.room.notify_all();
                pending.finish(Ok(Arc::clone(&bytes)));
                Ok(bytes)
            }
            Err(e) => {
                if ours {
                    if let Some(e) = s.blocks.remove(&key) {
                        s.held -= e.charge;
                    }
                }
                drop(s);
                self.room.notify_all();
                pending.finish(Err((e.kind(), e.to_string())));
                Err(e)
            }
        }
    }
}

fn insert_loading(s: &mut State, key: BlockKey, len: u64) -> Arc<Pending> {
    let p = Arc::new(Pending::default());
    s.blocks.insert(
        key,
        Entry {
            slot: Slot::Loading(Arc::clone(&p)),
            charge: len,
        },
    );
    s.held += len;
    s.stats.peak_bytes = s.stats.peak_bytes.max(s.held);
    p
}

/// Evicts least recently used ready blocks until `len` more bytes fit. A demand read may
/// evict any ready block; a prefetch only blocks a reader has used. False when that is
/// not enough (the pool is full of blocks in flight, or of unread prefetches).
fn make_room(s: &mut State, len: u64, budget: u64, demand: bool) -> bool {
    while s.held + len > budget {
        let victim = s
            .blocks
            .iter()
            .filter_map(|(k, e)| match e.slot {
                Slot::Ready { last_use, used, .. } if demand || used => Some((!used, last_use, *k)),
                _ => None,
            })
            // Used blocks go first, then the least recently touched.
            .min_by_key(|&(unused, last_use, _)| (unused, last_use));
        let Some((unused, _, key)) = victim else {
            return false;
        };
        if unused {
            s.stats.evicted_unused += 1;
        }
        if let Some(e) = s.blocks.remove(&key) {
            s.held -= e.charge;
            if let Slot::Ready { bytes, .. } = e.slot {
                if s.free.len() < FREE_MAX {
                    if let Ok(buf) = Arc::try_unwrap(bytes) {
                        s.free.push(buf);
                    }
                }
            }
        }
    }
    true
}
