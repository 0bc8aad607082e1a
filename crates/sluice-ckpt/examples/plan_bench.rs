//! Planning plus dedup coordination for a grouped save of simulated ranks: every rank's
//! digests pooled, grouped by holder set, planned by max-flow and bisection. Issue 14's
//! target: at most 50 ms for 64 ranks × 1,000 chunks each.
//!
//!     cargo run --release -p sluice-ckpt --example plan_bench [-- RANKS CHUNKS RUNS]
//!
//! Layouts: `replicated` (DDP: every rank holds every chunk), `sharded` (FSDP: no chunk
//! repeats), `mixed` (8-way tensor parallel × data parallel, a replicated part, zero-filled
//! moments held by all), each planned cold (a new pattern) and warm (from the plan cache).

use std::collections::HashSet;
use std::time::Instant;

use sluice_ckpt::{ChunkRef, Digest, PlanInput, WritePlanner};

const CHUNK: u64 = 4 << 20;

fn digest(tag: u64, i: u64) -> ChunkRef {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&tag.to_le_bytes());
    b[8..].copy_from_slice(&i.to_le_bytes());
    ChunkRef {
        digest: Digest::of(&b),
        len: CHUNK,
    }
}

fn layout(name: &str, ranks: usize, chunks: u64) -> Vec<Vec<ChunkRef>> {
    (0..ranks)
        .map(|r| match name {
            "replicated" => (0..chunks).map(|i| digest(0, i)).collect(),
            "sharded" => (0..chunks).map(|i| digest(1 + r as u64, i)).collect(),
            _ => {
                // 8-way TP: rank r holds TP shard r % 8, replicated across the DP groups;
                // a tenth replicated everywhere; a tenth zero-filled moments (one digest).
                let tp = (r % 8) as u64;
                let mut v: Vec<ChunkRef> =
                    (0..chunks * 8 / 10).map(|i| digest(100 + tp, i)).collect();
                v.extend((0..chunks / 10).map(|i| digest(0, i)));
                v.extend((0..chunks / 10).map(|_| digest(999, 0)));
                v
            }
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ranks = *args.first().unwrap_or(&64) as usize;
    let chunks = *args.get(1).unwrap_or(&1000);
    let runs = *args.get(2).unwrap_or(&7) as usize;
    println!("{ranks} ranks x {chunks} chunks of 4 MiB, median of {runs} runs");
    println!(
        "{:<12} {:>12} {:>12} {:>14}",
        "layout", "cold ms", "warm ms", "makespan s"
    );
    for name in ["replicated", "sharded", "mixed"] {
        let held = layout(name, ranks, chunks);
        // Rank bandwidths 1.0-2.0 GB/s: measured ones differ.
        let bw: Vec<f64> = (0..ranks)
            .map(|r| 1e9 * (1.0 + (r % 5) as f64 / 4.0))
            .collect();
        let stored = HashSet::new();
        let input = PlanInput {
            ranks: &held,
            bandwidth: &bw,
            stored: &stored,
        };
        let (mut cold, mut warm, mut makespan) = (Vec::new(), Vec::new(), 0.0);
        for _ in 0..runs {
            let mut planner = WritePlanner::new();
            let t = Instant::now();
            let p = planner.plan(&input).expect("plannable");
            cold.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let q = planner.plan(&input).expect("plannable");
            warm.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(q.cached && q.assignments == p.assignments);
            makespan = p.makespan_s;
        }
        println!(
            "{name:<12} {:>12.2} {:>12.2} {:>14.3}",
            median(cold),
            median(warm),
            makespan
        );
    }
}
