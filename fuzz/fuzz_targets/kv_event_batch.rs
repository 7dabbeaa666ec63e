//! The KV-event batch decoder on arbitrary payloads: it must never panic,
//! and whatever it accepts must apply to an index without panicking and
//! leave the index consistent (a stream's blocks gone once it is removed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal::kv_events::wire::decode_batch;
use shoal::kv_events::{Coverage, KvIndex};

fuzz_target!(|data: &[u8]| {
    let Ok(batch) = decode_batch(data) else {
        return;
    };
    for block_size in [1, 4] {
        let mut index = KvIndex::new(block_size, 64);
        let stream = index.add_stream(1);
        index.set_coverage(stream, Coverage::Complete);
        index.apply(stream, &batch.events);
        index.apply(stream, &batch.events);
        assert!(index.blocks_of(stream) <= 64);
        index.remove_stream(stream);
        assert_eq!(index.distinct_blocks(), 0);
    }
});
