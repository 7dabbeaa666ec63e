use super::*;
use crate::kv_events::wire::{KvEvent, Removed, Stored};

const BS: usize = 2;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::Stored(Stored {
        block_hashes: hashes.to_vec(),
        parent,
        token_ids: Some(tokens.to_vec()),
        block_size: Some(BS as u32),
        lora: None,
        on_gpu: true,
        main_group: true,
    })
}

fn removed(hashes: &[u64]) -> KvEvent {
    KvEvent::Removed(Removed {
        block_hashes: hashes.to_vec(),
        on_gpu: true,
        main_group: true,
    })
}

fn prompt(tokens: &[u32]) -> Vec<u64> {
    chain::blocks(chain::seed(None), tokens, BS)
}

fn matches(index: &KvIndex, tokens: &[u32]) -> Vec<(u64, usize)> {
    let mut out = Vec::new();
    index.matches(&prompt(tokens), &mut out);
    out.sort();
    out
}

fn warm(index: &mut KvIndex, worker: u64) -> StreamId {
    let id = index.add_stream(worker);
    index.set_coverage(id, Coverage::Complete);
    id
}

#[test]
fn stored_chains_match_prompts_by_their_tokens_not_the_engine_hashes() {
    let mut index = KvIndex::new(BS, 100);
    let a = warm(&mut index, 1);
    let b = warm(&mut index, 2);
    // Engine A stores [1 2][3 4] then, as a second event, [5 6] under it;
    // engine B (another hash function) stores [1 2].
    index.apply(a, &[stored(&[101, 102], None, &[1, 2, 3, 4])]);
    index.apply(a, &[stored(&[103], Some(102), &[5, 6])]);
    index.apply(b, &[stored(&[9001], None, &[1, 2])]);
    assert_eq!(
        matches(&index, &[1, 2, 3, 4, 5, 6, 7]),
        vec![(1, 3), (2, 1)]
    );
    assert_eq!(matches(&index, &[1, 2, 9, 9]), vec![(1, 1), (2, 1)]);
    assert_eq!(
        matches(&index, &[3, 4]),
        vec![],
        "no match without the prefix"
    );
    assert_eq!(index.blocks_of(a), 3);
    assert_eq!(index.distinct_blocks(), 3, "a shared block is one entry");
}

#[test]
fn removal_clearing_and_cold_streams() {
    let mut index = KvIndex::new(BS, 100);
    let a = warm(&mut index, 1);
    index.apply(a, &[stored(&[101, 102], None, &[1, 2, 3, 4])]);
    let applied = index.apply(a, &[removed(&[102, 999])]);
    assert_eq!(applied.removed, 1, "an unknown hash is ignored");
    assert_eq!(matches(&index, &[1, 2, 3, 4]), vec![(1, 1)]);
    index.set_coverage(a, Coverage::Cold);
    assert_eq!(
        matches(&index, &[1, 2]),
        vec![],
        "a cold stream is not routed on"
    );
    index.set_coverage(a, Coverage::Suffix);
    index.apply(a, &[KvEvent::AllCleared]);
    assert_eq!(matches(&index, &[1, 2]), vec![]);
    assert_eq!(index.distinct_blocks(), 0);
    index.apply(a, &[stored(&[101], None, &[1, 2])]);
    index.remove_stream(a);
    assert_eq!(
        index.distinct_blocks(),
        0,
        "a removed stream leaves nothing"
    );
    assert_eq!(index.worker_coverage(1), Coverage::Cold);
}

#[test]
fn blocks_that_cannot_be_chained_are_skipped_and_counted() {
    let mut index = KvIndex::new(BS, 100);
    let a = warm(&mut index, 1);
    // Unknown parent; wrong block size; no tokens; another tier; too few tokens.
    let mut events = vec![stored(&[5], Some(4), &[1, 2])];
    let mut other_size = stored(&[6], None, &[1, 2, 3]);
    if let KvEvent::Stored(s) = &mut other_size {
        s.block_size = Some(3);
    }
    events.push(other_size);
    let mut no_tokens = stored(&[7], None, &[]);
    if let KvEvent::Stored(s) = &mut no_tokens {
        s.token_ids = None;
    }
    events.push(no_tokens);
    let mut cpu = stored(&[8], None, &[1, 2]);
    if let KvEvent::Stored(s) = &mut cpu {
        s.on_gpu = false;
    }
    events.push(cpu);
    events.push(stored(&[9, 10], None, &[1, 2]));
    events.push(KvEvent::Unknown("Fancy".into()));
    let applied = index.apply(a, &events);
    assert_eq!(applied.stored, 0);
    assert_eq!(applied.skipped, 6);
    assert_eq!(applied.unknown, 1);
    assert_eq!(index.blocks_of(a), 0);
}

#[test]
fn a_full_stream_indexes_nothing_more_and_reannouncements_are_idempotent() {
    let mut index = KvIndex::new(BS, 2);
    let a = warm(&mut index, 1);
    let applied = index.apply(a, &[stored(&[1, 2, 3], None, &[1, 2, 3, 4, 5, 6])]);
    assert_eq!((applied.stored, applied.over_capacity), (2, 1));
    let again = index.apply(a, &[stored(&[1, 2], None, &[1, 2, 3, 4])]);
    assert_eq!(again.stored, 0);
    assert_eq!(matches(&index, &[1, 2, 3, 4, 5, 6]), vec![(1, 2)]);
}

#[test]
fn adapters_chain_apart() {
    let mut index = KvIndex::new(BS, 100);
    let a = warm(&mut index, 1);
    let mut lora = stored(&[1], None, &[1, 2]);
    if let KvEvent::Stored(s) = &mut lora {
        s.lora = Some("my-lora".into());
    }
    index.apply(a, &[lora]);
    assert_eq!(
        matches(&index, &[1, 2]),
        vec![],
        "base-model prompt, adapter block"
    );
    let mut out = Vec::new();
    index.matches(
        &chain::blocks(chain::seed(Some("my-lora")), &[1, 2], BS),
        &mut out,
    );
    assert_eq!(out, vec![(1, 1)]);
}
