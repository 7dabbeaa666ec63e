use super::*;
use crate::kv_events::vectors::*;

const H1: u64 = 0x1122_3344_5566_7788;
const H2: u64 = 0xF1E2_D3C4_B5A6_9788;
const SGLANG_HASH: u64 = -1_234_567_890_123_456_789i64 as u64;

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// A one-event batch `[1.5, [event], 0]` around an encoded event.
fn batch_of(event_hex: &str) -> Vec<u8> {
    let mut out = bytes("93cb3ff800000000000091");
    out.extend(bytes(event_hex));
    out.push(0);
    out
}

fn stored(hashes: Vec<u64>) -> Stored {
    Stored {
        block_hashes: hashes,
        parent: None,
        token_ids: Some(vec![1, 2, 3, 4]),
        block_size: Some(4),
        lora: None,
        on_gpu: true,
        main_group: true,
    }
}

/// The store + remove + clear batch every release's vector encodes.
fn common_batch(hashes: Vec<u64>, removed: u64, dp_rank: Option<u32>) -> EventBatch {
    EventBatch {
        ts: Some(1.5),
        events: vec![
            KvEvent::Stored(stored(hashes)),
            KvEvent::Removed(Removed {
                block_hashes: vec![removed],
                on_gpu: true,
                main_group: true,
            }),
            KvEvent::AllCleared,
        ],
        dp_rank,
    }
}

#[test]
fn every_vllm_release_layout_decodes_to_the_same_events() {
    // Positional 0.9.0 (2-element batch), positional with medium (0.10.2),
    // positional with every field through 0.23 (0.22.0), map events
    // (0.24.0), map events with a map16 header (0.34.0).
    assert_eq!(
        decode_batch(&bytes(VLLM_0_9_0)).unwrap(),
        common_batch(vec![H1, H2], H2, None)
    );
    for hex in [VLLM_0_10_2, VLLM_0_22_0, VLLM_0_24_0, VLLM_0_34_0] {
        assert_eq!(
            decode_batch(&bytes(hex)).unwrap(),
            common_batch(vec![H1, H2], H2, Some(0)),
            "{hex}"
        );
    }
}

#[test]
fn sglang_positional_and_map_layouts_decode() {
    let expected = common_batch(vec![SGLANG_HASH], SGLANG_HASH, Some(0));
    assert_eq!(decode_batch(&bytes(SGLANG_0_4_7)).unwrap(), expected);
    assert_eq!(decode_batch(&bytes(SGLANG_0_5_23)).unwrap(), expected);
    let no_rank = decode_batch(&bytes(SGLANG_0_5_23_NO_RANK)).unwrap();
    assert_eq!(no_rank.events, vec![KvEvent::AllCleared]);
    assert_eq!(no_rank.dp_rank, None);
}

#[test]
fn byte_hashes_become_their_last_eight_bytes() {
    // vLLM's int mode sends the digest's low 64 bits: bytes must agree.
    let tail = 0x1819_1a1b_1c1d_1e1f;
    for hex in [VLLM_0_10_2_STORED_BYTES_HASH, VLLM_0_34_0_STORED_BYTES_HASH] {
        let batch = decode_batch(&batch_of(hex)).unwrap();
        assert_eq!(batch.events, vec![KvEvent::Stored(stored(vec![tail]))]);
    }
}

#[test]
fn optional_fields_name_the_adapter_and_the_group() {
    // 0.34 with everything set: lora_name wins over lora_id; group 1 of a
    // sliding-window spec is not the main attention group.
    let batch = decode_batch(&batch_of(VLLM_0_34_0_STORED_ALL_FIELDS)).unwrap();
    let [KvEvent::Stored(event)] = batch.events.as_slice() else {
        panic!("{batch:?}");
    };
    assert_eq!(event.parent, Some(H1));
    assert_eq!(event.lora.as_deref(), Some("my-lora"));
    assert!(!event.main_group);
    assert!(event.on_gpu);
    let batch = decode_batch(&batch_of(SGLANG_0_5_23_STORED_LORA)).unwrap();
    let [KvEvent::Stored(event)] = batch.events.as_slice() else {
        panic!("{batch:?}");
    };
    assert_eq!(event.lora.as_deref(), Some("my-lora"));
    assert!(event.main_group);
}

#[test]
fn real_captures_decode() {
    // vLLM 0.26 (kthena#1535's shape): map event, u64 hash above 2^63.
    let batch = decode_batch(&bytes(VLLM_0_26_0_CAPTURE)).unwrap();
    let [KvEvent::Stored(event)] = batch.events.as_slice() else {
        panic!("{batch:?}");
    };
    assert_eq!(event.block_hashes, vec![15_760_518_052_499_183_552]);
    assert_eq!(event.token_ids.as_ref().map(Vec::len), Some(16));
    assert_eq!(event.block_size, Some(16));
    assert!(event.main_group, "group 0 of a full_attention spec");
    // A positional vLLM capture with a parent.
    let batch = decode_batch(&bytes(VLLM_REAL_CAPTURE)).unwrap();
    let [KvEvent::Stored(event)] = batch.events.as_slice() else {
        panic!("{batch:?}");
    };
    assert_eq!(event.parent, Some(15_722_805_041_033_817_089));
    assert_eq!(event.token_ids.as_ref().map(|t| t[0]), Some(4217));
}

#[test]
fn signed_hashes_and_eagle_pairs() {
    let batch = decode_batch(&bytes(VLLM_0_9_0_SIGNED)).unwrap();
    let KvEvent::Stored(event) = &batch.events[0] else {
        panic!("{batch:?}");
    };
    assert_eq!(
        event.block_hashes,
        vec![-4_242_424_242_424_242_424i64 as u64]
    );
    assert_eq!(event.parent, Some(u64::MAX), "-1 is a hash like any other");
    let batch = decode_batch(&batch_of(SGLANG_0_5_23_EAGLE)).unwrap();
    let KvEvent::Stored(event) = &batch.events[0] else {
        panic!("{batch:?}");
    };
    assert_eq!(event.token_ids, Some(vec![10, 11]), "first of each pair");
    assert_eq!(event.parent, Some(4));
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let good = bytes(VLLM_0_34_0);
    // Every truncation of a good batch is an error.
    for cut in 0..good.len() {
        assert!(decode_batch(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert_eq!(decode_batch(&trailing), Err(WireError::Trailing(1)));
    // Nesting past the limit.
    let deep: Vec<u8> = std::iter::repeat_n(0x91, 100).chain([0xc0]).collect();
    assert!(matches!(decode_batch(&deep), Err(WireError::Msgpack(_))));
    // A huge array header with no body.
    assert!(decode_batch(&bytes("dd7fffffff")).is_err());
    // Wrong shapes: an int batch, events that are not a list, a hash that
    // is a string, token ids above u32.
    assert!(decode_batch(&bytes("07")).is_err());
    assert!(decode_batch(&bytes("92cb3ff800000000000007")).is_err());
    let string_hash = batch_of("93ab426c6f636b53746f72656491a178c0");
    assert!(decode_batch(&string_hash).is_err());
    let big_token = batch_of("95ab426c6f636b53746f7265649101c091cf000000010000000004");
    assert!(decode_batch(&big_token).is_err());
}

#[test]
fn unknown_events_and_extra_fields_are_tolerated() {
    // ["Fancy"] and a BlockRemoved with two extra trailing fields.
    let batch = batch_of("91a546616e6379");
    assert_eq!(
        decode_batch(&batch).unwrap().events,
        vec![KvEvent::Unknown("Fancy".to_string())]
    );
    let removed = batch_of("95ac426c6f636b52656d6f766564910ac00102");
    assert_eq!(
        decode_batch(&removed).unwrap().events,
        vec![KvEvent::Removed(Removed {
            block_hashes: vec![10],
            on_gpu: true,
            main_group: false,
        })]
    );
}

/// A tiny xorshift for the round-trip tests (fixed, platform-independent).
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A random event this decoder can represent, and how an engine would
/// encode it: positionally (`["BlockStored", …]`) or as a map with the tag
/// written last (any key order is legal msgpack).
fn random_event(state: &mut u64, map: bool) -> (KvEvent, rmpv::Value) {
    use rmpv::Value;
    let n = (next(state) % 5) as usize;
    let hashes: Vec<u64> = (0..n).map(|_| next(state)).collect();
    let hash_values: Vec<Value> = hashes
        .iter()
        .map(|h| {
            if h % 3 == 0 {
                Value::from(*h as i64)
            } else {
                Value::from(*h)
            }
        })
        .collect();
    let medium = ["GPU", "CPU_TIER"][(next(state) % 2) as usize];
    let group = next(state) % 2;
    let fields: Vec<(&str, Value)>;
    let event = match next(state) % 3 {
        0 => {
            let tokens: Vec<u32> = (0..n * 4).map(|_| (next(state) % 200_000) as u32).collect();
            let parent = next(state).is_multiple_of(2).then(|| next(state));
            fields = vec![
                ("block_hashes", Value::Array(hash_values)),
                ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
                (
                    "token_ids",
                    Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
                ),
                ("block_size", Value::from(4)),
                ("lora_id", Value::Nil),
                ("medium", Value::from(medium)),
                ("lora_name", Value::Nil),
                ("extra_keys", Value::Array(vec![Value::Array(vec![])])),
                ("group_idx", Value::from(group)),
            ];
            KvEvent::Stored(Stored {
                block_hashes: hashes,
                parent,
                token_ids: Some(tokens),
                block_size: Some(4),
                lora: None,
                on_gpu: medium == "GPU",
                main_group: group == 0,
            })
        }
        1 => {
            fields = vec![
                ("block_hashes", Value::Array(hash_values)),
                ("medium", Value::from(medium)),
                ("group_idx", Value::from(group)),
            ];
            KvEvent::Removed(Removed {
                block_hashes: hashes,
                on_gpu: medium == "GPU",
                main_group: group == 0,
            })
        }
        _ => {
            fields = vec![];
            KvEvent::AllCleared
        }
    };
    let tag = match &event {
        KvEvent::Stored(_) => "BlockStored",
        KvEvent::Removed(_) => "BlockRemoved",
        _ => "AllBlocksCleared",
    };
    let value = if map {
        let mut entries: Vec<(Value, Value)> = fields
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect();
        entries.push((Value::from("type"), Value::from(tag)));
        Value::Map(entries)
    } else {
        let mut items = vec![Value::from(tag)];
        items.extend(fields.into_iter().map(|(_, v)| v));
        Value::Array(items)
    };
    (event, value)
}

#[test]
fn random_batches_encoded_by_rmpv_decode_to_what_was_encoded() {
    let mut state = 0x5eed_0f0e_cafe_f00du64;
    for round in 0..500 {
        let map = round % 2 == 1;
        let count = (next(&mut state) % 6) as usize;
        let (events, values): (Vec<KvEvent>, Vec<rmpv::Value>) =
            (0..count).map(|_| random_event(&mut state, map)).unzip();
        let batch = rmpv::Value::Array(vec![
            rmpv::Value::F64(1.25),
            rmpv::Value::Array(values),
            rmpv::Value::from(round % 4),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &batch).unwrap();
        let decoded = decode_batch(&bytes).unwrap();
        assert_eq!(decoded.events, events, "round {round}");
        assert_eq!(decoded.dp_rank, Some((round % 4) as u32));
        assert_eq!(decoded.ts, Some(1.25));
        // And every truncation of it is an error, never a panic.
        for cut in (0..bytes.len()).step_by(7) {
            assert!(
                decode_batch(&bytes[..cut]).is_err(),
                "round {round} cut {cut}"
            );
        }
    }
}

#[test]
fn a_bad_field_of_an_unknown_event_is_ignored_but_of_a_known_one_is_an_error() {
    use rmpv::Value;
    let encode = |event: Value| {
        let mut bytes = Vec::new();
        let batch = Value::Array(vec![Value::F64(0.0), Value::Array(vec![event])]);
        rmpv::encode::write_value(&mut bytes, &batch).unwrap();
        bytes
    };
    let bad_hashes = |tag: &str| {
        Value::Map(vec![
            (Value::from("block_hashes"), Value::from("not a list")),
            (Value::from("type"), Value::from(tag)),
        ])
    };
    assert_eq!(
        decode_batch(&encode(bad_hashes("FutureEvent")))
            .unwrap()
            .events,
        vec![KvEvent::Unknown("FutureEvent".into())]
    );
    assert_eq!(
        decode_batch(&encode(bad_hashes("BlockRemoved"))),
        Err(WireError::Shape("an event has no block_hashes list"))
    );
    // A bad element inside an unknown event's hash list is skipped whole:
    // the next event is read from the right place.
    let bad_element = Value::Map(vec![
        (
            Value::from("block_hashes"),
            Value::Array(vec![Value::from("x"), Value::from(1), Value::from(2)]),
        ),
        (Value::from("type"), Value::from("FutureEvent")),
    ]);
    let mut bytes = Vec::new();
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![
            bad_element,
            Value::Array(vec![Value::from("AllBlocksCleared")]),
        ]),
    ]);
    rmpv::encode::write_value(&mut bytes, &batch).unwrap();
    assert_eq!(
        decode_batch(&bytes).unwrap().events,
        vec![KvEvent::Unknown("FutureEvent".into()), KvEvent::AllCleared]
    );
    // A header claiming 2^32 - 1 events reserves nothing it has not read.
    let mut huge = vec![0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff];
    huge.extend([0x91, 0xa1, b'x']);
    assert!(decode_batch(&huge).is_err());
    // A repeated key keeps its first value.
    let twice = Value::Map(vec![
        (Value::from("type"), Value::from("BlockRemoved")),
        (
            Value::from("block_hashes"),
            Value::Array(vec![Value::from(7)]),
        ),
        (Value::from("block_hashes"), Value::from("ignored")),
    ]);
    let events = decode_batch(&encode(twice)).unwrap().events;
    let [KvEvent::Removed(removed)] = events.as_slice() else {
        panic!("not one removal");
    };
    assert_eq!(removed.block_hashes, vec![7]);
}
