//! [`Streams`]: the sequential read streams within one file, and how far ahead of each to
//! prefetch.
//!
//! Each file keeps up to `max` cursors. A read that starts near a cursor's next expected
//! offset (a little behind, for reordered kernel reads, or up to a window ahead) advances
//! that cursor; any other read starts a new cursor, replacing the least recently advanced
//! one. Two threads copying from one mmap'd file are two cursors, and neither resets the
//! other: the failure the issue measured in Mountpoint's one prefetcher per open file.
//!
//! A cursor prefetches once it has seen `trigger` sequential reads (a safetensors file's
//! first cursor starts armed). It keeps `window` blocks past the reader asked for, topping
//! up as the reader moves; the window starts at `min_window` blocks and doubles with each
//! top-up, up to `max_window`. A jump away drops the cursor, and with it the prefetch not
//! yet started (its cancel flag).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Prefetch settings, in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    pub max_cursors: usize,
    pub trigger: u32,
    pub min_window: u64,
    pub max_window: u64,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            max_cursors: 8,
            trigger: 2,
            min_window: 2,
            max_window: 32,
        }
    }
}

struct Cursor {
    /// Byte offset the next sequential read starts at.
    next: u64,
    hits: u32,
    window: u64,
    /// Blocks below this are prefetched or asked for.
    ahead_to: u64,
    last_tick: u64,
    cancel: Arc<AtomicBool>,
}

/// Blocks to prefetch for one cursor, and the flag that cancels them.
#[derive(Debug)]
pub struct Prefetch {
    pub blocks: Range<u64>,
    pub cancel: Arc<AtomicBool>,
}

pub struct Streams {
    cursors: Vec<Cursor>,
    tick: u64,
    config: StreamConfig,
    block: u64,
}

impl Streams {
    pub fn new(config: StreamConfig, block_bytes: u64) -> Streams {
        Streams {
            cursors: Vec::new(),
            tick: 0,
            config,
            block: block_bytes,
        }
    }

    /// Starts a cursor at `offset` that prefetches at once (a safetensors file read from
    /// its start); returns its first prefetch.
    pub fn arm(&mut self, offset: u64, file_len: u64) -> Option<Prefetch> {
        self.tick += 1;
        let cursor = Cursor {
            next: offset,
            hits: self.config.trigger,
            window: self.config.min_window,
            ahead_to: offset / self.block,
            last_tick: self.tick,
            cancel: Arc::new(AtomicBool::new(false)),
        };
        let i = self.place(cursor);
        self.extend(i, file_len)
    }

    /// Records a read of `len` bytes at `offset`; returns what to prefetch, if anything.
    pub fn on_read(&mut self, offset: u64, len: u64, file_len: u64) -> Option<Prefetch> {
        self.tick += 1;
        let tick = self.tick;
        let behind = self.block;
        let found = self.cursors.iter().position(|c| {
            let ahead = (c.window.max(1)) * self.block;
            offset + behind >= c.next && offset <= c.next + ahead
        });
        let i = match found {
            Some(i) => {
                let c = &mut self.cursors[i];
                if offset + len > c.next {
                    c.next = offset + len;
                }
                c.hits = c.hits.saturating_add(1);
                c.last_tick = tick;
                i
            }
            None => {
                let cursor = Cursor {
                    next: offset + len,
                    hits: 1,
                    window: self.config.min_window,
                    ahead_to: (offset + len).div_ceil(self.block),
                    last_tick: tick,
                    cancel: Arc::new(AtomicBool::new(false)),
                };
                self.place(cursor)
            }
        };
        self.extend(i, file_len)
    }

    /// Current cursors' next offsets (for tests and stats).
    pub fn positions(&self) -> Vec<u64> {
        self.cursors.iter().map(|c| c.next).collect()
    }

    /// Cancels every cursor's pending prefetch (the file's last handle closed).
    pub fn clear(&mut self) {
        for c in self.cursors.drain(..) {
            c.cancel.store(true, Ordering::Relaxed);
        }
    }

    fn place(&mut self, cursor: Cursor) -> usize {
        if self.cursors.len() < self.config.max_cursors.max(1) {
            self.cursors.push(cursor);
            return self.cursors.len() - 1;
        }
        let (oldest, _) = self
            .cursors
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.last_tick)
            .unwrap_or((0, &self.cursors[0]));
        self.cursors[oldest].cancel.store(true, Ordering::Relaxed);
        self.cursors[oldest] = cursor;
        oldest
    }

    /// Grows cursor `i`'s prefetch when its reader has passed the middle of it.
    fn extend(&mut self, i: usize, file_len: u64) -> Option<Prefetch> {
        let block = self.block;
        let last_block = file_len.div_ceil(block);
        let config = self.config;
        let c = &mut self.cursors[i];
        if c.hits < config.trigger {
            return None;
        }
        let at = c.next / block;
        let target = (at + c.window).min(last_block);
        if target <= c.ahead_to.max(at) {
            return None;
        }
        let from = c.ahead_to.max(at);
        c.ahead_to = target;
        c.window = (c.window * 2).min(config.max_window.max(config.min_window));
        Some(Prefetch {
            blocks: from..target,
            cancel: Arc::clone(&c.cancel),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 1 << 20;

    fn blocks(p: Option<Prefetch>) -> Option<Range<u64>> {
        p.map(|p| p.blocks)
    }

    #[test]
    fn a_sequential_reader_arms_after_the_trigger_and_the_window_grows() {
        let config = StreamConfig {
            max_window: 8,
            ..StreamConfig::default()
        };
        let mut s = Streams::new(config, B);
        let len = 100 * B;
        assert_eq!(blocks(s.on_read(0, B / 2, len)), None);
        assert_eq!(blocks(s.on_read(B / 2, B / 2, len)), Some(1..3));
        assert_eq!(blocks(s.on_read(B, B, len)), Some(3..6));
        let mut last = 6;
        for k in 2..40 {
            if let Some(r) = blocks(s.on_read(k * B, B, len)) {
                assert_eq!(r.start, last, "prefetch continues where it stopped");
                assert!(r.end - k <= 8 + 1, "window capped: {r:?} at {k}");
                last = r.end;
            }
        }
        assert!(last >= 40);
    }

    #[test]
    fn two_interleaved_streams_do_not_reset_each_other() {
        let mut s = Streams::new(StreamConfig::default(), B);
        let len = 200 * B;
        let (mut a, mut b) = (0u64, 100 * B);
        let mut got = Vec::new();
        for _ in 0..20 {
            got.extend(blocks(s.on_read(a, B, len)));
            got.extend(blocks(s.on_read(b, B, len)));
            a += B;
            b += B;
        }
        assert_eq!(s.positions().len(), 2, "{:?}", s.positions());
        let covered: u64 = got.iter().map(|r| r.end - r.start).sum();
        // Both streams prefetch ahead (at least their 20 blocks each), with no block twice.
        assert!(covered >= 40, "{got:?}");
        let mut all: Vec<u64> = got.iter().flat_map(|r| r.clone()).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n, "a block prefetched twice: {got:?}");
    }

    #[test]
    fn random_reads_prefetch_nothing_and_cursors_stay_bounded() {
        let mut s = Streams::new(StreamConfig::default(), B);
        let len = 10_000 * B;
        for k in 0..50u64 {
            // Distinct offsets at least 10 blocks apart: none continues another.
            let off = (k * 7919 % 997) * 10 * B;
            assert_eq!(blocks(s.on_read(off, 4096, len)), None, "read {k}");
        }
        assert!(s.positions().len() <= 8);
    }

    #[test]
    fn an_evicted_cursor_cancels_its_prefetch_and_arm_starts_at_once() {
        let config = StreamConfig {
            max_cursors: 1,
            ..StreamConfig::default()
        };
        let mut s = Streams::new(config, B);
        let first = s.arm(0, 50 * B).expect("armed");
        assert_eq!(first.blocks, 0..2);
        s.on_read(40 * B, B, 50 * B);
        assert!(first.cancel.load(Ordering::Relaxed));
        // The window stops at the file's end.
        let mut s = Streams::new(StreamConfig::default(), B);
        assert_eq!(s.arm(0, B + 1).map(|p| p.blocks), Some(0..2));
    }
}
