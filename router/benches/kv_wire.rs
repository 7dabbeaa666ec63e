//! What a KV-event batch costs a replica, which takes every engine's
//! batches: the one-pass decoder (`kv_events::wire::decode_batch`) beside
//! an `rmpv` value tree of the same bytes (what the decoder used to build
//! first), and applying the decoded events to an index, side by side in
//! one run. The batch has the size the fleet benchmark's engines publish
//! (~60 KB: 16 `BlockStored` events in vLLM's map encoding, 64 blocks of
//! 16 tokens each). Run with `cargo bench -p shoal --bench kv_wire`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use divan::{Bencher, black_box};
use shoal::kv_events::wire::{KvEvent, decode_batch};

const EVENTS: usize = 16;
const BLOCKS: usize = 64;
const BLOCK: usize = 16;

fn main() {
    let batch = batch();
    let decoded = decode_batch(&batch).unwrap();
    let tokens: usize = decoded
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(s) => s.token_ids.as_ref().map_or(0, Vec::len),
            _ => 0,
        })
        .sum();
    eprintln!(
        "kv_wire bench: one batch of {} bytes, {EVENTS} BlockStored events, {tokens} tokens",
        batch.len()
    );
    divan::main();
}

fn str8(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// `[ts, [event; EVENTS], 0]`, each event
/// `{type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name}`.
fn batch() -> Vec<u8> {
    let mut out = vec![0x93, 0xcb];
    out.extend_from_slice(&1.5f64.to_bits().to_be_bytes());
    out.push(0xdc);
    out.extend_from_slice(&(EVENTS as u16).to_be_bytes());
    for e in 0..EVENTS {
        out.push(0x88);
        str8(&mut out, "type");
        str8(&mut out, "BlockStored");
        str8(&mut out, "block_hashes");
        out.push(0xdc);
        out.extend_from_slice(&(BLOCKS as u16).to_be_bytes());
        for b in 0..BLOCKS {
            out.push(0xcf);
            out.extend_from_slice(
                &(((e as u64) << 32 | b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_be_bytes(),
            );
        }
        str8(&mut out, "parent_block_hash");
        out.push(0xc0);
        str8(&mut out, "token_ids");
        out.push(0xdc);
        out.extend_from_slice(&((BLOCKS * BLOCK) as u16).to_be_bytes());
        for t in 0..BLOCKS * BLOCK {
            out.push(0xcd);
            out.extend_from_slice(&(((t * 7 + e) % 60_000) as u16 + 256).to_be_bytes());
        }
        str8(&mut out, "block_size");
        out.push(BLOCK as u8);
        str8(&mut out, "lora_id");
        out.push(0xc0);
        str8(&mut out, "medium");
        str8(&mut out, "GPU");
        str8(&mut out, "lora_name");
        out.push(0xc0);
    }
    out.push(0x00);
    out
}

#[divan::bench(sample_count = 100)]
fn decode_batch_52kb(bencher: Bencher) {
    let batch = batch();
    bencher.bench(|| decode_batch(black_box(&batch)).unwrap());
}

#[divan::bench(sample_count = 100)]
fn rmpv_value_tree_52kb(bencher: Bencher) {
    let batch = batch();
    bencher
        .bench(|| rmpv::decode::read_value_with_max_depth(&mut black_box(&batch[..]), 16).unwrap());
}

/// Applying the decoded batch to an index: chaining its 16,384 tokens
/// into Shoal's block hashes and recording 1,024 new blocks (a fresh
/// stream each sample, as a replica sees an engine's new blocks).
#[divan::bench(sample_count = 100)]
fn apply_batch_52kb(bencher: Bencher) {
    use shoal::kv_events::{Coverage, KvIndex};
    let events = decode_batch(&batch()).unwrap().events;
    bencher
        .with_inputs(|| {
            let mut index = KvIndex::new(BLOCK, 1 << 20);
            let stream = index.add_stream(1);
            index.set_coverage(stream, Coverage::Complete);
            (index, stream)
        })
        .bench_local_refs(|(index, stream)| index.apply(*stream, black_box(&events)));
}
