//! Synthetic traces in the Mooncake format, so the benchmark (and CI) can
//! replay prefix reuse without downloading a trace. Sizes are in trace
//! tokens (512-token blocks, as in the real traces) and get the same
//! length scaling as a real trace; arrival times are Poisson at a nominal
//! rate that `--trace-load` rescales anyway.
//!
//! - [`TraceKind::Chat`]: multi-turn conversations. Each turn's prompt is
//!   the previous turn's whole prompt, its answer and a new user message,
//!   so its `hash_ids` are the previous turn's ids plus new ones. Every
//!   conversation starts with one shared system block (as block 0 in
//!   Mooncake's conversation trace); conversations are interleaved.
//! - [`TraceKind::Agentic`]: tool-using agents. Every request starts with
//!   one long shared tool/system prefix, then one of a few branch prefixes
//!   of mid length (a task's context), then a short unique suffix.

use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};

use super::{BLOCK_TOKENS, TraceRequest};

/// Which synthetic trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// Multi-turn chat: turns extend their conversation's history.
    Chat,
    /// Agents: a shared tool prefix, branch prefixes, unique suffixes.
    Agentic,
}

impl TraceKind {
    /// The name on the command line (`gen:<name>`, `--kind <name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            TraceKind::Chat => "chat",
            TraceKind::Agentic => "agentic",
        }
    }
}

impl FromStr for TraceKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "chat" => Ok(TraceKind::Chat),
            "agentic" => Ok(TraceKind::Agentic),
            other => Err(format!(
                "unknown trace kind {other:?} (expected chat or agentic)"
            )),
        }
    }
}

/// Chat: conversations in progress at once (interleaved).
pub const CHAT_ACTIVE: usize = 16;
/// Chat: turns per conversation, inclusive range.
pub const CHAT_TURNS: (u32, u32) = (2, 8);
/// Chat: shared system-prompt blocks at the start of every conversation.
pub const CHAT_SYSTEM_BLOCKS: u64 = 1;
/// Chat: tokens of the first user message.
pub const CHAT_FIRST_USER: (u64, u64) = (500, 4_000);
/// Chat: tokens of each later user message.
pub const CHAT_NEXT_USER: (u64, u64) = (50, 800);
/// Chat: answer tokens.
pub const CHAT_OUTPUT: (u64, u64) = (50, 600);
/// Chat: a conversation ends before its prompt would pass this (tokens).
pub const CHAT_MAX_CONTEXT: u64 = 32_768;
/// Chat: nominal arrivals per trace second.
pub const CHAT_RATE: f64 = 5.0;
/// Agentic: blocks of the tool/system prefix every request shares.
pub const AGENT_SHARED_BLOCKS: u64 = 16;
/// Agentic: branches (tasks) sharing a mid-length prefix.
pub const AGENT_BRANCHES: usize = 24;
/// Agentic: blocks of a branch prefix, inclusive range.
pub const AGENT_BRANCH_BLOCKS: (u64, u64) = (2, 8);
/// Agentic: blocks of a request's unique suffix, inclusive range (the
/// last one partial).
pub const AGENT_SUFFIX_BLOCKS: (u64, u64) = (1, 3);
/// Agentic: answer tokens (tool calls are short).
pub const AGENT_OUTPUT: (u64, u64) = (10, 300);
/// Agentic: nominal arrivals per trace second.
pub const AGENT_RATE: f64 = 10.0;

/// Hands out fresh block ids.
struct Ids(u64);

impl Ids {
    fn take(&mut self, n: u64) -> Vec<u64> {
        let ids = (self.0..self.0 + n).collect();
        self.0 += n;
        ids
    }
}

/// Poisson arrival times in ms at `rate` per second.
struct Clock {
    gap: Option<Exp<f64>>,
    at_s: f64,
}

impl Clock {
    fn new(rate: f64) -> Self {
        Self {
            gap: Exp::new(rate).ok(),
            at_s: 0.0,
        }
    }

    fn next(&mut self, rng: &mut StdRng) -> u64 {
        let ms = (self.at_s * 1e3).round() as u64;
        self.at_s += self.gap.map_or(1.0, |g| g.sample(rng));
        ms
    }
}

/// `requests` requests of a `kind` trace, all drawn from `seed`.
pub fn generate(kind: TraceKind, requests: usize, seed: u64) -> Vec<TraceRequest> {
    let mut rng = StdRng::seed_from_u64(seed);
    match kind {
        TraceKind::Chat => chat(&mut rng, requests),
        TraceKind::Agentic => agentic(&mut rng, requests),
    }
}

/// One conversation: its history so far and the turns it has left.
struct Conversation {
    ids: Vec<u64>,
    input: u64,
    last_output: u64,
    turns_left: u32,
}

fn chat(rng: &mut StdRng, requests: usize) -> Vec<TraceRequest> {
    let mut ids = Ids(0);
    let system = ids.take(CHAT_SYSTEM_BLOCKS);
    let mut clock = Clock::new(CHAT_RATE);
    let mut slots: Vec<Option<Conversation>> = (0..CHAT_ACTIVE).map(|_| None).collect();
    let mut out = Vec::with_capacity(requests);
    while out.len() < requests {
        let slot = &mut slots[rng.random_range(0..CHAT_ACTIVE)];
        let user_next = rng.random_range(CHAT_NEXT_USER.0..=CHAT_NEXT_USER.1);
        let goes_on = slot.as_ref().is_some_and(|c| {
            c.turns_left > 0 && c.input + c.last_output + user_next <= CHAT_MAX_CONTEXT
        });
        let (prior, input) = match slot.take().filter(|_| goes_on) {
            // The whole previous prompt (its partial last block included:
            // this turn fills it), its answer and the new message.
            Some(c) => {
                let input = c.input + c.last_output + user_next;
                (c, input)
            }
            None => {
                let user = rng.random_range(CHAT_FIRST_USER.0..=CHAT_FIRST_USER.1);
                let fresh = Conversation {
                    ids: system.clone(),
                    input: CHAT_SYSTEM_BLOCKS * BLOCK_TOKENS,
                    last_output: 0,
                    turns_left: rng.random_range(CHAT_TURNS.0..=CHAT_TURNS.1),
                };
                (fresh, CHAT_SYSTEM_BLOCKS * BLOCK_TOKENS + user)
            }
        };
        let mut hash_ids = prior.ids;
        let more = input.div_ceil(BLOCK_TOKENS) - hash_ids.len() as u64;
        hash_ids.extend(ids.take(more));
        let output = rng.random_range(CHAT_OUTPUT.0..=CHAT_OUTPUT.1);
        out.push(TraceRequest {
            timestamp: clock.next(rng),
            input_length: input,
            output_length: output,
            hash_ids: hash_ids.clone(),
        });
        *slot = Some(Conversation {
            ids: hash_ids,
            input,
            last_output: output,
            turns_left: prior.turns_left.saturating_sub(1),
        });
    }
    out
}

fn agentic(rng: &mut StdRng, requests: usize) -> Vec<TraceRequest> {
    let mut ids = Ids(0);
    let shared = ids.take(AGENT_SHARED_BLOCKS);
    let branches: Vec<Vec<u64>> = (0..AGENT_BRANCHES)
        .map(|_| {
            let n = rng.random_range(AGENT_BRANCH_BLOCKS.0..=AGENT_BRANCH_BLOCKS.1);
            ids.take(n)
        })
        .collect();
    let mut clock = Clock::new(AGENT_RATE);
    (0..requests)
        .map(|_| {
            let branch = &branches[rng.random_range(0..AGENT_BRANCHES)];
            let suffix = rng.random_range(AGENT_SUFFIX_BLOCKS.0..=AGENT_SUFFIX_BLOCKS.1);
            let mut hash_ids = shared.clone();
            hash_ids.extend_from_slice(branch);
            hash_ids.extend(ids.take(suffix));
            let full = hash_ids.len() as u64 - 1;
            let last = rng.random_range(1..=BLOCK_TOKENS);
            TraceRequest {
                timestamp: clock.next(rng),
                input_length: full * BLOCK_TOKENS + last,
                output_length: rng.random_range(AGENT_OUTPUT.0..=AGENT_OUTPUT.1),
                hash_ids,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn generated_traces_are_valid_seeded_and_in_time_order() {
        for kind in [TraceKind::Chat, TraceKind::Agentic] {
            let t = generate(kind, 500, 3);
            assert_eq!(t.len(), 500);
            assert_eq!(t, generate(kind, 500, 3));
            assert_ne!(t, generate(kind, 500, 4));
            for r in &t {
                r.validate().unwrap();
            }
            assert!(t.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
            assert_eq!(kind.as_str().parse::<TraceKind>(), Ok(kind));
        }
        assert!("chatty".parse::<TraceKind>().is_err());
    }

    #[test]
    fn each_chat_turn_extends_its_previous_turn() {
        let t = generate(TraceKind::Chat, 2_000, 9);
        // A conversation is known by its first non-system block.
        let mut last: HashMap<u64, &TraceRequest> = HashMap::new();
        let mut follow_ups = 0;
        let mut starts = 0;
        for r in &t {
            assert_eq!(
                r.hash_ids[0], 0,
                "every conversation shares the system block"
            );
            let key = r.hash_ids[CHAT_SYSTEM_BLOCKS as usize];
            if let Some(prev) = last.get(&key) {
                assert!(r.hash_ids.starts_with(&prev.hash_ids));
                assert!(r.input_length > prev.input_length + prev.output_length);
                follow_ups += 1;
            } else {
                starts += 1;
            }
            last.insert(key, r);
        }
        assert!(
            follow_ups > 2 * starts,
            "{follow_ups} follow-ups, {starts} starts"
        );
        // Interleaved: consecutive requests usually belong to different
        // conversations.
        let same = t
            .windows(2)
            .filter(|w| w[0].hash_ids[1] == w[1].hash_ids[1])
            .count();
        assert!(same < t.len() / 4, "{same}");
    }

    #[test]
    fn every_agentic_request_has_the_shared_prefix_and_a_branch() {
        let t = generate(TraceKind::Agentic, 1_000, 5);
        let shared: Vec<u64> = (0..AGENT_SHARED_BLOCKS).collect();
        let mut branches: HashMap<u64, usize> = HashMap::new();
        let mut suffixes = std::collections::HashSet::new();
        for r in &t {
            assert!(r.hash_ids.starts_with(&shared));
            *branches
                .entry(r.hash_ids[AGENT_SHARED_BLOCKS as usize])
                .or_default() += 1;
            let last = r.hash_ids.last().copied().unwrap_or_default();
            assert!(suffixes.insert(last), "suffix block {last} repeated");
        }
        assert_eq!(branches.len(), AGENT_BRANCHES);
        assert!(branches.values().all(|&n| n > 10));
    }
}
