//! What `precise_prefix` costs per request at 1,024 workers with an
//! 8k-token prompt, split where the time goes: tokenizing the prompt
//! (whole, and as a conversation's later turn whose history the prefix
//! cache holds), chaining its blocks, the index walk, and the whole
//! selection (all of these plus least_load's scores over every worker) for
//! a prompt nothing cached begins like and for a later turn. Before the samples
//! it prints the index's memory per block (a fill of 100 engines × 100k
//! blocks, measured as the process's resident-set growth) and the figure
//! that implies at 1,000 engines × 100k blocks.
//! Run with `cargo bench -p shoal --bench precise_prefix`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use divan::{Bencher, black_box};
use shoal::config::{BreakerConfig, KvEventsConfig, LeastLoadConfig, PrefixAffinityConfig};
use shoal::fleet::LocalFleet;
use shoal::kv_events::wire::{KvEvent, Stored};
use shoal::kv_events::{Coverage, KvEvents, KvIndex, Tokenizers, chain};
use shoal::policy::{Policy, PrecisePrefixPolicy};
use shoal::request::RequestInfo;
use shoal::workers::Worker;
use shoal_proto::{EngineKind, EngineLoad, LoadSnapshot};

const WORKERS: usize = 1024;
const TARGET_TOKENS: usize = 8192;
const BLOCK: usize = 16;

fn main() {
    print_index_memory();
    divan::main();
}

fn tokenizer_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json")
}

fn tokenizers() -> Tokenizers {
    Tokenizers::load(&[(None, tokenizer_path())], &[]).unwrap()
}

/// [`make_prompt_text`], made once per seed: making it tokenizes it many
/// times, and doing that between samples would flush the caches the
/// measured selection runs on (a replica routing requests back to back
/// keeps its workers' state cached).
fn prompt_text(seed: u64) -> String {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static MADE: OnceLock<Mutex<HashMap<u64, String>>> = OnceLock::new();
    let made = MADE.get_or_init(Mutex::default);
    if let Some(text) = made.lock().unwrap().get(&seed) {
        return text.clone();
    }
    let text = make_prompt_text(seed);
    made.lock().unwrap().insert(seed, text.clone());
    text
}

/// A prompt of about 8k tokens: a shared 2k-token system part, then a
/// user part unique to `seed`.
fn make_prompt_text(seed: u64) -> String {
    const WORDS: [&str; 12] = [
        "the ", "quick ", "brown ", "fox ", "router ", "engine ", "cache ", "prefix ", "block ",
        "token ", "request ", "reply ",
    ];
    let tokens = tokenizers();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut text = String::new();
    let mut words = 0usize;
    loop {
        if words == 2000 {
            state ^= seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1;
        }
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(WORDS[(state % 12) as usize]);
        words += 1;
        if words.is_multiple_of(512) && tokens.encode(None, &text).unwrap().len() >= TARGET_TOKENS {
            return text;
        }
    }
}

fn request(seed: u64) -> RequestInfo {
    with_text(prompt_text(seed))
}

/// 1,024 polled workers; every worker's engine caches the first quarter of
/// the prompt (its shared part), one in 64 all of it (the engine that
/// served the conversation's last turn).
fn setup() -> (
    PrecisePrefixPolicy,
    Vec<Arc<Worker>>,
    LocalFleet,
    Vec<RequestInfo>,
) {
    let policy = PrecisePrefixPolicy::new(
        KvEventsConfig {
            kv_tokenizer: vec![tokenizer_path().display().to_string()],
            ..KvEventsConfig::default()
        },
        PrefixAffinityConfig::default(),
        LeastLoadConfig::default(),
    );
    let workers: Vec<Arc<Worker>> = (0..WORKERS)
        .map(|i| {
            Arc::new(Worker::new(
                format!("http://engine-{i}:8000"),
                BreakerConfig::default(),
            ))
        })
        .collect();
    for (i, w) in workers.iter().enumerate() {
        w.store_snapshot(
            LoadSnapshot {
                source: EngineKind::Sglang,
                load: EngineLoad {
                    token_usage: Some((i * 37 % 90) as f64 / 100.0),
                    queued_tokens: Some((i * 131 % 8000) as u64),
                    gen_throughput: Some(1500.0),
                    ..EngineLoad::default()
                },
                polled_at_unix_ms: 0,
                poller: "bench".into(),
            },
            std::time::Instant::now(),
        );
    }
    let requests: Vec<RequestInfo> = (0..4).map(request).collect();
    let kv = policy.kv_events().unwrap();
    let tokens = tokenizers()
        .encode(None, requests[0].text.as_deref().unwrap())
        .unwrap();
    let full = tokens.len() / BLOCK;
    {
        let mut index = kv.index().write().unwrap();
        for (i, w) in workers.iter().enumerate() {
            let stream = index.add_stream(w.id());
            index.set_coverage(stream, Coverage::Complete);
            let blocks = if i % 64 == 0 { full } else { full / 4 };
            index.apply(stream, &[stored(i as u64, &tokens[..blocks * BLOCK])]);
        }
    }
    eprintln!(
        "precise_prefix bench: {WORKERS} workers, prompt {} tokens ({} blocks of {BLOCK}), {} chars",
        tokens.len(),
        full,
        requests[0].text.as_deref().unwrap().len()
    );
    (
        policy,
        workers,
        LocalFleet::new(Duration::from_secs(3600)),
        requests,
    )
}

fn stored(engine: u64, tokens: &[u32]) -> KvEvent {
    let blocks = tokens.len() / BLOCK;
    KvEvent::Stored(Stored {
        block_hashes: (0..blocks as u64).map(|b| (engine << 32) | b).collect(),
        parent: None,
        token_ids: Some(tokens.to_vec()),
        block_size: Some(BLOCK as u32),
        lora: None,
        on_gpu: true,
        main_group: true,
    })
}

/// A later turn of the conversation `prompt_text(1)` is the history of:
/// that text and ~200 new tokens unique to `turn`.
fn later_turn(turn: u64) -> String {
    format!(
        "{} and then question {turn} asks about the {} router {}",
        prompt_text(1),
        turn * 7919,
        "cache engine block ".repeat(50)
    )
}

/// A prompt nothing cached starts like (its first word is unique).
fn cold_prompt(n: u64) -> String {
    format!("cold{n} {}", prompt_text(1))
}

#[divan::bench(sample_count = 50)]
fn tokenize_8k_whole(bencher: Bencher) {
    let tokenizer = tokenizers::Tokenizer::from_file(tokenizer_path()).unwrap();
    let text = prompt_text(1);
    bencher.bench_local(|| black_box(tokenizer.encode_fast(black_box(text.as_str()), true)));
}

#[divan::bench(sample_count = 50)]
fn tokenize_8k_later_turn(bencher: Bencher) {
    let tokens = tokenizers();
    tokens.encode(None, &prompt_text(1)).unwrap();
    let mut turn = 0;
    bencher
        .with_inputs(|| {
            turn += 1;
            later_turn(turn)
        })
        .bench_local_refs(|text| black_box(tokens.encode(None, text)));
}

fn chat_template_path() -> PathBuf {
    tokenizer_path().with_file_name("chat_template.jinja")
}

/// A later turn of the conversation as a chat body: a system message, the
/// history as the first user message, an answer and ~200 new tokens.
fn chat_later_turn(turn: u64) -> RequestInfo {
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": prompt_text(1)},
        {"role": "assistant", "content": "tok tok tok tok"},
        {"role": "user", "content": format!("question {turn} asks about the {} router", turn * 7919)},
    ]});
    shoal::request::inspect(body.to_string().as_bytes(), Some(1 << 20)).unwrap()
}

#[divan::bench(sample_count = 50)]
fn chat_template_render_8k(bencher: Bencher) {
    use shoal::kv_events::chat_template::{ChatTemplate, TemplateMessage};
    let template = ChatTemplate::load(&chat_template_path()).unwrap();
    let history = prompt_text(1);
    let messages = [
        TemplateMessage {
            role: "system",
            content: "You are terse.",
        },
        TemplateMessage {
            role: "user",
            content: &history,
        },
    ];
    bencher.bench_local(|| black_box(template.render(black_box(&messages))));
}

#[divan::bench(sample_count = 50)]
fn chat_later_turn_template_and_tokenize(bencher: Bencher) {
    let tokens =
        Tokenizers::load(&[(None, tokenizer_path())], &[(None, chat_template_path())]).unwrap();
    tokens.encode_request(&chat_later_turn(0)).unwrap();
    let mut turn = 0;
    bencher
        .with_inputs(|| {
            turn += 1;
            chat_later_turn(turn)
        })
        .bench_local_refs(|request| black_box(tokens.encode_request(request)));
}

#[divan::bench(sample_count = 50)]
fn chain_blocks_8k(bencher: Bencher) {
    let ids = tokenizers().encode(None, &prompt_text(1)).unwrap();
    bencher.bench_local(|| black_box(chain::blocks(chain::seed(None), black_box(&ids), BLOCK)));
}

#[divan::bench(sample_count = 50)]
fn index_walk_1024(bencher: Bencher) {
    let (policy, _workers, _fleet, requests) = setup();
    let kv: Arc<KvEvents> = policy.kv_events().unwrap();
    let blocks = kv.prompt_blocks(&requests[0]).unwrap().hashes;
    let mut out = shoal::id_hash::IdMap::default();
    bencher.bench_local(|| {
        kv.cached_blocks(black_box(&blocks), &mut out);
        black_box(out.len())
    });
}

/// `request` with its text replaced.
fn with_text(text: String) -> RequestInfo {
    RequestInfo {
        text: Some(text),
        ..request_template()
    }
}

fn request_template() -> RequestInfo {
    RequestInfo {
        prompt_tokens: TARGET_TOKENS as u64,
        max_output_tokens: Some(256),
        stream: true,
        ..RequestInfo::default()
    }
}

#[divan::bench(sample_count = 50)]
fn select_1024_workers_8k_cold_prompt(bencher: Bencher) {
    let (policy, workers, fleet, _requests) = setup();
    let mut n = 0;
    bencher
        .with_inputs(|| {
            n += 1;
            with_text(cold_prompt(n))
        })
        .bench_local_refs(|request| black_box(policy.select(&workers, request, &fleet)));
}

#[divan::bench(sample_count = 50)]
fn select_1024_workers_8k_later_turn(bencher: Bencher) {
    let (policy, workers, fleet, _requests) = setup();
    policy.select(&workers, &with_text(prompt_text(1)), &fleet);
    let mut turn = 0;
    bencher
        .with_inputs(|| {
            turn += 1;
            with_text(later_turn(turn))
        })
        .bench_local_refs(|request| black_box(policy.select(&workers, request, &fleet)));
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Fills an index with `engines` × `blocks` distinct blocks and prints the
/// resident-set growth per block.
fn print_index_memory() {
    let (engines, blocks) = (100usize, 100_000usize);
    let before = rss_bytes();
    let mut index = KvIndex::new(BLOCK, blocks);
    let tokens: Vec<u32> = (0..(1000 * BLOCK) as u32).collect();
    for e in 0..engines {
        let stream = index.add_stream(e as u64);
        // Chains of 1,000 blocks, each engine's own (distinct tokens).
        for c in 0..blocks / 1000 {
            let seeded: Vec<u32> = tokens
                .iter()
                .map(|t| t ^ ((e * 1000 + c) as u32) << 14)
                .collect();
            let mut event = stored(((e * 1000 + c) as u64) << 10, &seeded);
            if let KvEvent::Stored(s) = &mut event {
                s.block_hashes = (0..1000u64)
                    .map(|b| ((e * 1000 + c) as u64) << 16 | b)
                    .collect();
            }
            index.apply(stream, &[event]);
        }
    }
    let grown = rss_bytes().saturating_sub(before);
    let total = (engines * blocks) as u64;
    let per_block = grown as f64 / total as f64;
    eprintln!(
        "kv index memory: {engines} engines x {blocks} blocks = {total} blocks ({} distinct): RSS +{:.0} MB, {per_block:.1} B/block; at 1,000 engines x 100k blocks: {:.1} GB",
        index.distinct_blocks(),
        grown as f64 / 1e6,
        per_block * 1e8 / 1e9
    );
    black_box(index);
}

#[divan::bench(sample_count = 50)]
fn prompt_blocks_8k_later_turn(bencher: Bencher) {
    let (policy, _workers, _fleet, _requests) = setup();
    let kv: Arc<KvEvents> = policy.kv_events().unwrap();
    kv.prompt_blocks(&with_text(prompt_text(1))).unwrap();
    let mut turn = 0;
    bencher
        .with_inputs(|| {
            turn += 1;
            with_text(later_turn(turn))
        })
        .bench_local_refs(|request| black_box(kv.prompt_blocks(request)));
}
