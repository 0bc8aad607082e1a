//! A seeded generator of KV-cache workloads, written as Mooncake-style JSONL.
//!
//! The workload is a set of **sessions**: long-lived chat threads (or agent
//! sessions) that users come back to. What matters to a KV cache is which
//! prompt prefixes repeat and how soon, so the generator models the three
//! sources of reuse seen in production traces (Mooncake, Qwen-Bailian):
//!
//! - **Shared system prompts.** A few system prompts, each many blocks long,
//!   are shared by all sessions; every session uses one of them.
//! - **Multi-turn growth.** A turn's prompt is the system prompt, the whole
//!   conversation so far (user messages and answers) and the new message, so
//!   every turn re-reads the previous turn's prompt as its prefix. A thread
//!   ends after a number of turns drawn uniformly in `1..=max_turns`, or when
//!   the next prompt would pass `max_context_tokens`; the session then
//!   starts a new thread on the same system prompt.
//! - **Agentic tool loops.** A fraction of sessions are agents: a task opens
//!   with a user message and continues with many short steps, each appending
//!   the model's tool call and the tool's output, seconds apart.
//!
//! **Popularity and time.** Session `s` (0-based rank) is revisited at rate
//! `arrival_rate_per_s × p(s)` with `p(s) ∝ (s + 1)^-zipf_alpha` (a Zipf
//! law): the gap before a chat turn (or before an agent's next task) is an
//! exponential draw at that rate plus an exponential think time with mean
//! `think_time_s`; agent steps inside a task are `tool_time_s` apart on
//! average. Superposed over many sessions the visits are close to a Poisson
//! process at `arrival_rate_per_s`; think time slows the hottest sessions,
//! whose popularity gap is shorter than a human's reply, so the realized
//! request rate is somewhat lower. Generation stops after `requests`
//! requests, emitted in time order.
//!
//! **Block ids.** Prompts are cut into blocks of `block_tokens` tokens. A
//! block's id chains the previous block's id with the identity of the
//! content it covers (which message segments, at which offsets, how many
//! tokens), so equal token prefixes get equal ids and a block is shared only
//! if the whole prefix up to it is shared; a partial last block differs from
//! the full block it later grows into. The 64-bit chain hashes are renamed
//! to consecutive integers in order of first appearance, as Mooncake does.
//!
//! **Reproducibility.** Each session draws from its own SplitMix64 stream
//! derived from the seed (`sluice_policy::rng::Rng`, stable by
//! construction), and the only floating-point functions used (`ln`, `exp`)
//! are computed here from IEEE-exact `+ - × ÷ √`, not the platform's libm,
//! so the same config and seed give byte-identical output on every platform
//! and release.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use sluice_policy::id_map::{id_map_with_capacity, IdMap};
use sluice_policy::rng::Rng;

use crate::error::SimError;
use crate::trace::mooncake::{self, MooncakeConfig, MooncakeLine, DEFAULT_BLOCK_TOKENS};
use crate::trace::Trace;

mod math;
mod token_dist;

use math::{exp, exponential, ln, mix};
pub use token_dist::TokenDist;

/// The generator's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct KvWorkloadConfig {
    /// Seed of every random draw. Default 0.
    pub seed: u64,
    /// Distinct sessions (threads users return to). Default 1,000: enough
    /// for a long Zipf tail, few enough that hot threads recur within a
    /// 10,000-request trace.
    pub sessions: u32,
    /// Requests to generate. Default 10,000: a trace that replays in well
    /// under a second per policy yet holds thousands of distinct blocks.
    pub requests: u64,
    /// Distinct system prompts shared across sessions. Default 4: a service
    /// runs a handful of assistants and agents; 0 means none.
    pub system_prompts: u32,
    /// Tokens of each system prompt. Default 4,096: tool and agent
    /// instructions run to thousands of tokens, here 8 blocks of 512.
    pub system_prompt_tokens: u64,
    /// Zipf exponent of session popularity. Default 1.0, the classic skew
    /// of web and chat popularity; 0 makes sessions equally popular.
    pub zipf_alpha: f64,
    /// Tokens of a user message. Default lognormal, median 200, sigma 1.0:
    /// most messages are short, a few paste whole documents.
    pub user_tokens: TokenDist,
    /// Tokens of an answer (or an agent's tool call). Default lognormal,
    /// median 300, sigma 0.8: answers are longer than questions and less
    /// spread.
    pub answer_tokens: TokenDist,
    /// Most turns of one chat thread. Default 10: chat logs such as ShareGPT
    /// average a few turns with a tail past ten.
    pub max_turns: u32,
    /// Share of sessions that are agents. Default 0.05: an agent issues a
    /// whole tool loop (about 8 steps) per visit where a chat user issues
    /// one turn, so 5% of sessions make about a third of the requests.
    pub agentic_fraction: f64,
    /// Most steps of one agent task (drawn uniformly from 1). Default 16:
    /// coding and browsing agents run up to tens of tool calls per task.
    pub agentic_max_turns: u32,
    /// Tokens of one tool output. Default lognormal, median 600, sigma 1.2:
    /// file reads and search results vary from a line to whole files.
    pub tool_output_tokens: TokenDist,
    /// Mean seconds between steps of an agent task (tool run plus decode).
    /// Default 2.
    pub tool_time_s: f64,
    /// Visits per second over all sessions (each turn of a chat, each task
    /// of an agent). Default 5: a busy single-node deployment.
    pub arrival_rate_per_s: f64,
    /// Mean seconds a user reads and types before the next turn. Default 30.
    pub think_time_s: f64,
    /// Tokens per hashed block. Default [`DEFAULT_BLOCK_TOKENS`], as in
    /// Mooncake's traces.
    pub block_tokens: u64,
    /// Longest prompt; a thread that would grow past it starts over.
    /// Default 131,072, the context window of Llama 3.1 and gpt-oss.
    pub max_context_tokens: u64,
}

impl Default for KvWorkloadConfig {
    fn default() -> KvWorkloadConfig {
        KvWorkloadConfig {
            seed: 0,
            sessions: 1_000,
            requests: 10_000,
            system_prompts: 4,
            system_prompt_tokens: 4_096,
            zipf_alpha: 1.0,
            user_tokens: TokenDist::lognormal(200.0, 1.0),
            answer_tokens: TokenDist::lognormal(300.0, 0.8),
            max_turns: 10,
            agentic_fraction: 0.05,
            agentic_max_turns: 16,
            tool_output_tokens: TokenDist::lognormal(600.0, 1.2),
            tool_time_s: 2.0,
            arrival_rate_per_s: 5.0,
            think_time_s: 30.0,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            max_context_tokens: 131_072,
        }
    }
}

impl KvWorkloadConfig {
    /// Rejects knobs the generator cannot honour, naming the knob.
    pub fn validate(&self) -> Result<(), SimError> {
        let fail = |m: &str| Err(SimError::config("gen-kv", m));
        let finite_non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if self.sessions == 0 {
            return fail("sessions must be at least 1");
        }
        if self.max_turns == 0 || self.agentic_max_turns == 0 {
            return fail("max_turns and agentic_max_turns must be at least 1");
        }
        if !finite_non_negative(self.zipf_alpha) {
            return fail(&format!(
                "zipf_alpha {} is not a number ≥ 0",
                self.zipf_alpha
            ));
        }
        if !(0.0..=1.0).contains(&self.agentic_fraction) {
            return fail(&format!(
                "agentic_fraction {} is not in [0, 1]",
                self.agentic_fraction
            ));
        }
        if !(self.arrival_rate_per_s.is_finite() && self.arrival_rate_per_s > 0.0) {
            return fail(&format!(
                "arrival_rate_per_s {} is not > 0",
                self.arrival_rate_per_s
            ));
        }
        if !finite_non_negative(self.think_time_s) || !finite_non_negative(self.tool_time_s) {
            return fail("think_time_s and tool_time_s must be numbers ≥ 0");
        }
        if self.block_tokens == 0 || self.max_context_tokens == 0 {
            return fail("block_tokens and max_context_tokens must be at least 1");
        }
        Ok(())
    }
}

/// One generated request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvRequest {
    /// Milliseconds since the start of the trace.
    pub timestamp_ms: u64,
    /// Session rank: 0 is the most popular.
    pub session: u32,
    /// Turn within the session's current thread or task, from 0.
    pub turn: u32,
    pub agentic: bool,
    /// Prompt tokens.
    pub input_length: u64,
    /// Answer tokens.
    pub output_length: u64,
    /// Block ids of the prompt, `ceil(input_length / block_tokens)` of them.
    pub hash_ids: Vec<u64>,
}

impl KvRequest {
    /// The request as a Mooncake JSONL line.
    pub fn line(&self) -> MooncakeLine<'_> {
        MooncakeLine {
            timestamp: self.timestamp_ms,
            input_length: self.input_length,
            output_length: self.output_length,
            hash_ids: &self.hash_ids,
        }
    }
}

/// Generates the workload `config` describes.
pub fn generate(config: &KvWorkloadConfig) -> Result<Vec<KvRequest>, SimError> {
    config.validate()?;
    let rates = session_rates(config);
    let mut sessions: Vec<Session> = (0..config.sessions)
        .map(|s| Session::new(config, s))
        .collect();
    let mut queue = BinaryHeap::with_capacity(sessions.len());
    for (s, session) in sessions.iter_mut().enumerate() {
        let first = session.visit_gap_us(rates[s]);
        queue.push(Reverse((first, s as u32)));
    }
    let mut ids = DenseIds::default();
    let mut requests = Vec::with_capacity(usize::try_from(config.requests).unwrap_or(0));
    while (requests.len() as u64) < config.requests {
        let Some(Reverse((time_us, s))) = queue.pop() else {
            break;
        };
        let session = &mut sessions[s as usize];
        let mut request = session.take_turn(config, s, time_us);
        ids.rename(&mut request.hash_ids);
        requests.push(request);
        let gap = session.next_gap_us(config, rates[s as usize]);
        queue.push(Reverse((time_us.saturating_add(gap), s)));
    }
    Ok(requests)
}

/// Writes generated requests as Mooncake JSONL.
pub fn write_jsonl(requests: &[KvRequest], path: &Path) -> Result<(), SimError> {
    mooncake::write_jsonl(requests.iter().map(KvRequest::line), path)
}

/// The trace a Mooncake reader would build from `requests`, without a file.
pub fn to_trace(
    requests: &[KvRequest],
    name: &str,
    config: &MooncakeConfig,
) -> Result<Trace, SimError> {
    mooncake::trace_from_lines(name, requests.iter().map(KvRequest::line), config)
}

/// Visit rate of each session: `arrival_rate_per_s × p(s)`, Zipf `p`.
fn session_rates(config: &KvWorkloadConfig) -> Vec<f64> {
    let weights: Vec<f64> = (1..=config.sessions)
        .map(|rank| exp(-config.zipf_alpha * ln(f64::from(rank))))
        .collect();
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| config.arrival_rate_per_s * w / total)
        .collect()
}

/// One run of text in a conversation: a system prompt, a message, an
/// answer or a tool output.
#[derive(Clone, Copy)]
struct Segment {
    /// Identity of the text: equal ids mean equal tokens.
    content: u64,
    tokens: u64,
}

/// A session's state between turns.
struct Session {
    rng: Rng,
    agentic: bool,
    /// The shared system prompt segment, if any.
    system: Option<Segment>,
    segments: Vec<Segment>,
    /// Token offset where each segment starts.
    starts: Vec<u64>,
    tokens: u64,
    /// Chain ids of the conversation's full blocks computed so far.
    full_blocks: Vec<u64>,
    turn: u32,
    turn_limit: u32,
    /// Threads (or tasks) started, for fresh content identities.
    thread: u64,
}

/// Salts that keep the content identities of different kinds apart.
const SYSTEM_SALT: u64 = 0x5359_5354_454D_0000;
const SESSION_SALT: u64 = 0x5345_5353_494F_4E00;
/// Chain hash of the empty prefix.
const ROOT: u64 = 0x6B76_2D72_6F6F_7400;

impl Session {
    fn new(config: &KvWorkloadConfig, s: u32) -> Session {
        let mut rng = Rng::new(mix(mix(config.seed) ^ mix(SESSION_SALT ^ u64::from(s))));
        let agentic = rng.next_f64() < config.agentic_fraction;
        let system = (config.system_prompts > 0 && config.system_prompt_tokens > 0).then(|| {
            let k = (u128::from(rng.next_u64()) * u128::from(config.system_prompts)) >> 64;
            Segment {
                content: mix(SYSTEM_SALT ^ k as u64),
                tokens: config.system_prompt_tokens,
            }
        });
        let mut session = Session {
            rng,
            agentic,
            system,
            segments: Vec::new(),
            starts: Vec::new(),
            tokens: 0,
            full_blocks: Vec::new(),
            turn: 0,
            turn_limit: 0,
            thread: 0,
        };
        session.restart(config);
        session
    }

    /// Starts a new thread (chat) or task (agent) on the same system prompt.
    fn restart(&mut self, config: &KvWorkloadConfig) {
        self.segments.clear();
        self.starts.clear();
        self.full_blocks.clear();
        self.tokens = 0;
        self.turn = 0;
        self.thread += 1;
        let most = if self.agentic {
            config.agentic_max_turns
        } else {
            config.max_turns
        };
        self.turn_limit = TokenDist::Uniform {
            min: 1,
            max: u64::from(most),
        }
        .sample(&mut self.rng) as u32;
        if let Some(system) = self.system {
            self.push(system);
        }
    }

    fn push(&mut self, segment: Segment) {
        self.starts.push(self.tokens);
        self.tokens += segment.tokens;
        self.segments.push(segment);
    }

    /// A fresh identity for the next segment of this thread: session,
    /// thread count and segment index, mixed.
    fn next_content(&self, s: u32) -> u64 {
        let thread = mix(SESSION_SALT ^ (u64::from(s) << 32) ^ self.thread);
        mix(thread ^ self.segments.len() as u64)
    }

    /// Builds and returns the prompt of this session's next turn at `time_us`.
    fn take_turn(&mut self, config: &KvWorkloadConfig, s: u32, time_us: u64) -> KvRequest {
        if self.turn >= self.turn_limit {
            self.restart(config);
        }
        let mut message = self.draw_message(config);
        if self.turn > 0 && self.tokens.saturating_add(message) > config.max_context_tokens {
            self.restart(config);
            message = self.draw_message(config);
        }
        let content = self.next_content(s);
        self.push(Segment {
            content,
            tokens: message,
        });
        let input_length = self.tokens;
        let hash_ids = self.block_ids(config.block_tokens);
        let output_length = config.answer_tokens.sample(&mut self.rng);
        // The answer joins the conversation the next turn re-reads.
        let answer = Segment {
            content: self.next_content(s),
            tokens: output_length,
        };
        self.push(answer);
        let request = KvRequest {
            timestamp_ms: time_us / 1_000,
            session: s,
            turn: self.turn,
            agentic: self.agentic,
            input_length,
            output_length,
            hash_ids,
        };
        self.turn += 1;
        request
    }

    /// A user message, or a tool output inside an agent task.
    fn draw_message(&mut self, config: &KvWorkloadConfig) -> u64 {
        if self.agentic && self.turn > 0 {
            config.tool_output_tokens.sample(&mut self.rng)
        } else {
            config.user_tokens.sample(&mut self.rng)
        }
    }

    /// Chain ids of the prompt's blocks: the full ones (cached, as the
    /// conversation only grows) and a partial last one.
    fn block_ids(&mut self, block_tokens: u64) -> Vec<u64> {
        let full = self.tokens / block_tokens;
        while (self.full_blocks.len() as u64) < full {
            let b = self.full_blocks.len() as u64;
            let prev = self.full_blocks.last().copied().unwrap_or(ROOT);
            let id = self.chain(prev, b * block_tokens, (b + 1) * block_tokens);
            self.full_blocks.push(id);
        }
        let mut ids = self.full_blocks[..full as usize].to_vec();
        if self.tokens % block_tokens != 0 {
            let prev = ids.last().copied().unwrap_or(ROOT);
            ids.push(self.chain(prev, full * block_tokens, self.tokens));
        }
        ids
    }

    /// Id of the block covering tokens `start..end`, after block `prev`.
    fn chain(&self, prev: u64, start: u64, end: u64) -> u64 {
        let first = self
            .starts
            .partition_point(|&s| s <= start)
            .saturating_sub(1);
        let mut content = mix(end - start);
        for (segment, &seg_start) in self.segments[first..].iter().zip(&self.starts[first..]) {
            if seg_start >= end {
                break;
            }
            let from = start.max(seg_start) - seg_start;
            let to = end.min(seg_start + segment.tokens) - seg_start;
            content = mix(content ^ mix(segment.content ^ mix(from ^ mix(to))));
        }
        mix(mix(prev) ^ content)
    }

    /// Microseconds until the next turn: inside an agent task, a tool step;
    /// otherwise a new visit.
    fn next_gap_us(&mut self, config: &KvWorkloadConfig, rate: f64) -> u64 {
        if self.agentic && self.turn < self.turn_limit {
            seconds_to_us(exponential(&mut self.rng, config.tool_time_s))
        } else {
            let think = exponential(&mut self.rng, config.think_time_s);
            seconds_to_us(think).saturating_add(self.visit_gap_us(rate))
        }
    }

    /// The popularity part of a gap: exponential at the session's rate.
    fn visit_gap_us(&mut self, rate: f64) -> u64 {
        seconds_to_us(exponential(&mut self.rng, 1.0 / rate))
    }
}

fn seconds_to_us(seconds: f64) -> u64 {
    // `as` saturates, so an enormous gap parks the session at the end of
    // time instead of wrapping.
    (seconds * 1e6).round() as u64
}

/// Renames 64-bit chain ids to 0, 1, 2, … in order of first appearance.
struct DenseIds {
    map: IdMap<u64>,
}

impl Default for DenseIds {
    fn default() -> DenseIds {
        DenseIds {
            map: id_map_with_capacity(1024),
        }
    }
}

impl DenseIds {
    fn rename(&mut self, ids: &mut [u64]) {
        for id in ids {
            let next = self.map.len() as u64;
            *id = *self.map.entry(*id).or_insert(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_knobs_are_config_errors() {
        let bad = [
            KvWorkloadConfig {
                sessions: 0,
                ..Default::default()
            },
            KvWorkloadConfig {
                zipf_alpha: -1.0,
                ..Default::default()
            },
            KvWorkloadConfig {
                agentic_fraction: 1.5,
                ..Default::default()
            },
            KvWorkloadConfig {
                arrival_rate_per_s: 0.0,
                ..Default::default()
            },
            KvWorkloadConfig {
                think_time_s: f64::NAN,
                ..Default::default()
            },
            KvWorkloadConfig {
                block_tokens: 0,
                ..Default::default()
            },
            KvWorkloadConfig {
                max_turns: 0,
                ..Default::default()
            },
        ];
        for config in bad {
            assert!(
                matches!(generate(&config), Err(SimError::Config(_))),
                "{config:?}"
            );
        }
    }

    #[test]
    fn partial_last_block_differs_from_the_full_block_it_grows_into() {
        let config = KvWorkloadConfig {
            system_prompts: 0,
            block_tokens: 4,
            ..Default::default()
        };
        let mut s = Session::new(&config, 0);
        s.push(Segment {
            content: 1,
            tokens: 6,
        });
        let before = s.block_ids(4);
        s.push(Segment {
            content: 2,
            tokens: 2,
        });
        let after = s.block_ids(4);
        assert_eq!(before.len(), 2);
        assert_eq!(after.len(), 2);
        assert_eq!(before[0], after[0]);
        assert_ne!(before[1], after[1]);
    }

    #[test]
    fn equal_prefixes_get_equal_ids_and_divergence_is_permanent() {
        let config = KvWorkloadConfig {
            system_prompts: 0,
            block_tokens: 4,
            ..Default::default()
        };
        let mut a = Session::new(&config, 0);
        let mut b = Session::new(&config, 1);
        for (x, y) in [(7, 7), (8, 9), (10, 10)] {
            a.push(Segment {
                content: x,
                tokens: 4,
            });
            b.push(Segment {
                content: y,
                tokens: 4,
            });
        }
        let (ia, ib) = (a.block_ids(4), b.block_ids(4));
        assert_eq!(ia[0], ib[0]);
        assert_ne!(ia[1], ib[1]);
        // Same content after a divergence is still a different block.
        assert_ne!(ia[2], ib[2]);
    }
}
