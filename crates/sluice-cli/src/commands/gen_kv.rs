//! `sluice sim gen-kv`: write a seeded Mooncake-style KV-cache workload.
//!
//! Flags override [`KvWorkloadConfig::default`] one by one; the summary
//! states what came out (requests, distinct blocks, time span) so a user can
//! size caches without reading the file.

use std::collections::HashSet;

use sluice_sim::generator::{self, KvRequest, KvWorkloadConfig, TokenDist};
use sluice_sim::SimError;

use crate::GenKvArgs;

pub fn run(args: &GenKvArgs) -> Result<(), SimError> {
    let config = config(args)?;
    let requests = generator::generate(&config)?;
    generator::write_jsonl(&requests, &args.out)?;
    let summary = Summary::of(&requests);
    if args.json {
        let text = serde_json::json!({
            "path": args.out.display().to_string(),
            "seed": config.seed,
            "requests": summary.requests,
            "agentic_requests": summary.agentic,
            "sessions_seen": summary.sessions,
            "distinct_blocks": summary.distinct_blocks,
            "block_reads": summary.block_reads,
            "block_tokens": config.block_tokens,
            "span_seconds": summary.span_s,
        });
        outln!("{text}");
    } else {
        outln!(
            "wrote {}: {} requests ({} agentic) from {} sessions over {:.0} s; \
             {} block reads of {} distinct {}-token blocks",
            args.out.display(),
            summary.requests,
            summary.agentic,
            summary.sessions,
            summary.span_s,
            summary.block_reads,
            summary.distinct_blocks,
            config.block_tokens,
        );
    }
    Ok(())
}

/// The generator config the flags describe.
pub fn config(args: &GenKvArgs) -> Result<KvWorkloadConfig, SimError> {
    let mut c = KvWorkloadConfig {
        seed: args.seed,
        ..KvWorkloadConfig::default()
    };
    let dist = |spec: &Option<String>, default: TokenDist| -> Result<TokenDist, SimError> {
        spec.as_deref().map_or(Ok(default), TokenDist::parse)
    };
    c.requests = args.requests.unwrap_or(c.requests);
    c.sessions = args.sessions.unwrap_or(c.sessions);
    c.system_prompts = args.system_prompts.unwrap_or(c.system_prompts);
    c.system_prompt_tokens = args.system_prompt_tokens.unwrap_or(c.system_prompt_tokens);
    c.zipf_alpha = args.zipf_alpha.unwrap_or(c.zipf_alpha);
    c.user_tokens = dist(&args.user_tokens, c.user_tokens)?;
    c.answer_tokens = dist(&args.answer_tokens, c.answer_tokens)?;
    c.max_turns = args.max_turns.unwrap_or(c.max_turns);
    c.agentic_fraction = args.agentic_fraction.unwrap_or(c.agentic_fraction);
    c.agentic_max_turns = args.agentic_max_turns.unwrap_or(c.agentic_max_turns);
    c.tool_output_tokens = dist(&args.tool_output_tokens, c.tool_output_tokens)?;
    c.tool_time_s = args.tool_time.unwrap_or(c.tool_time_s);
    c.arrival_rate_per_s = args.arrival_rate.unwrap_or(c.arrival_rate_per_s);
    c.think_time_s = args.think_time.unwrap_or(c.think_time_s);
    c.block_tokens = args.block_tokens.unwrap_or(c.block_tokens);
    c.max_context_tokens = args.max_context_tokens.unwrap_or(c.max_context_tokens);
    c.validate()?;
    Ok(c)
}

struct Summary {
    requests: usize,
    agentic: usize,
    sessions: usize,
    distinct_blocks: usize,
    block_reads: usize,
    span_s: f64,
}

impl Summary {
    fn of(requests: &[KvRequest]) -> Summary {
        let blocks: HashSet<u64> = requests
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .collect();
        let sessions: HashSet<u32> = requests.iter().map(|r| r.session).collect();
        let span_ms = match (requests.first(), requests.last()) {
            (Some(a), Some(b)) => b.timestamp_ms.saturating_sub(a.timestamp_ms),
            _ => 0,
        };
        Summary {
            requests: requests.len(),
            agentic: requests.iter().filter(|r| r.agentic).count(),
            sessions: sessions.len(),
            distinct_blocks: blocks.len(),
            block_reads: requests.iter().map(|r| r.hash_ids.len()).sum(),
            span_s: span_ms as f64 / 1000.0,
        }
    }
}
