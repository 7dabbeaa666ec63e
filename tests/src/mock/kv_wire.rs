//! The msgpack encodings of KV-cache event batches, as vLLM and SGLang put
//! them on the wire, so the mock's publisher is byte-identical to a real
//! engine's (known-answer tests below pin each layout).
//!
//! A batch is always the array `[ts: float64, events, dp_rank]`. Events:
//! * `vllm-array`: positional `["BlockStored", block_hashes,
//!   parent_block_hash, token_ids, block_size, lora_id, medium]`,
//!   `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`
//!   (vLLM 0.10.2–0.13);
//! * `vllm-map`: tagged maps `{"type": "BlockStored", "block_hashes", …,
//!   "medium", "lora_name"}` (vLLM 0.24–0.32 byte for byte);
//! * `sglang`: tagged maps without `lora_name`, hashes as signed i64
//!   (SGLang 0.5.20–0.5.23).

use std::fmt;
use std::str::FromStr;

use rmpv::Value;

/// The storage medium the mock's blocks live in (vLLM's `MEDIUM_GPU`).
const MEDIUM: &str = "GPU";

/// One change to an engine's prefix cache, as the engines report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks were cached: their engine hashes in chain order, the
    /// hash of the block before the first (`None` at a prompt's start),
    /// their tokens concatenated and the tokens per block.
    Stored {
        /// Engine hashes of the new blocks.
        block_hashes: Vec<u64>,
        /// Hash of the block before the first new one.
        parent_block_hash: Option<u64>,
        /// The new blocks' token ids, `block_hashes.len() * block_size`.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
    },
    /// Blocks were evicted.
    Removed {
        /// Engine hashes of the evicted blocks.
        block_hashes: Vec<u64>,
    },
    /// The whole cache was cleared (`/reset_prefix_cache`).
    Cleared,
}

/// Which engine's wire encoding the mock publishes (`--kv-events-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvEventsFormat {
    /// vLLM ≥ 0.24: tagged map events, unsigned hashes.
    #[default]
    VllmMap,
    /// vLLM 0.10.2–0.13: positional array events with `medium`.
    VllmArray,
    /// SGLang ≥ 0.5.20: tagged map events, signed hashes, no `lora_name`.
    Sglang,
}

impl KvEventsFormat {
    /// The format's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            KvEventsFormat::VllmMap => "vllm-map",
            KvEventsFormat::VllmArray => "vllm-array",
            KvEventsFormat::Sglang => "sglang",
        }
    }
}

impl fmt::Display for KvEventsFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KvEventsFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm-map" => Ok(KvEventsFormat::VllmMap),
            "vllm-array" => Ok(KvEventsFormat::VllmArray),
            "sglang" => Ok(KvEventsFormat::Sglang),
            other => Err(format!(
                "unknown KV-events format {other:?} (expected vllm-map, vllm-array or sglang)"
            )),
        }
    }
}

fn hash(format: KvEventsFormat, h: u64) -> Value {
    match format {
        // SGLang sends its hashes as signed 64-bit integers.
        KvEventsFormat::Sglang => Value::from(h as i64),
        KvEventsFormat::VllmMap | KvEventsFormat::VllmArray => Value::from(h),
    }
}

fn hashes(format: KvEventsFormat, hs: &[u64]) -> Value {
    Value::Array(hs.iter().map(|&h| hash(format, h)).collect())
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

/// One event as an msgpack value in `format`.
pub fn event_value(format: KvEventsFormat, event: &KvEvent) -> Value {
    match event {
        KvEvent::Stored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
        } => {
            let hs = hashes(format, block_hashes);
            let parent = parent_block_hash.map_or(Value::Nil, |p| hash(format, p));
            let tokens = Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect());
            let size = Value::from(*block_size);
            match format {
                KvEventsFormat::VllmArray => Value::Array(vec![
                    Value::from("BlockStored"),
                    hs,
                    parent,
                    tokens,
                    size,
                    Value::Nil,
                    Value::from(MEDIUM),
                ]),
                KvEventsFormat::VllmMap | KvEventsFormat::Sglang => {
                    let mut pairs = vec![
                        ("type", Value::from("BlockStored")),
                        ("block_hashes", hs),
                        ("parent_block_hash", parent),
                        ("token_ids", tokens),
                        ("block_size", size),
                        ("lora_id", Value::Nil),
                        ("medium", Value::from(MEDIUM)),
                    ];
                    if format == KvEventsFormat::VllmMap {
                        pairs.push(("lora_name", Value::Nil));
                    }
                    map(pairs)
                }
            }
        }
        KvEvent::Removed { block_hashes } => {
            let hs = hashes(format, block_hashes);
            match format {
                KvEventsFormat::VllmArray => {
                    Value::Array(vec![Value::from("BlockRemoved"), hs, Value::from(MEDIUM)])
                }
                KvEventsFormat::VllmMap | KvEventsFormat::Sglang => map(vec![
                    ("type", Value::from("BlockRemoved")),
                    ("block_hashes", hs),
                    ("medium", Value::from(MEDIUM)),
                ]),
            }
        }
        KvEvent::Cleared => match format {
            KvEventsFormat::VllmArray => Value::Array(vec![Value::from("AllBlocksCleared")]),
            KvEventsFormat::VllmMap | KvEventsFormat::Sglang => {
                map(vec![("type", Value::from("AllBlocksCleared"))])
            }
        },
    }
}

/// The msgpack payload of one batch: `[ts, events, dp_rank]`.
pub fn encode_batch(
    format: KvEventsFormat,
    ts: f64,
    events: &[KvEvent],
    dp_rank: u32,
) -> std::io::Result<Vec<u8>> {
    let batch = Value::Array(vec![
        Value::F64(ts),
        Value::Array(events.iter().map(|e| event_value(format, e)).collect()),
        Value::from(dp_rank),
    ]);
    let mut out = Vec::with_capacity(64 + 8 * events.len());
    rmpv::encode::write_value(&mut out, &batch).map_err(std::io::Error::other)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Copied from router/src/kv_events/vectors.rs (VLLM_0_10_2, VLLM_0_24_0,
    // SGLANG_0_5_23): each release's own structs through msgspec.
    const VLLM_0_10_2: &str = "93cb3ff80000000000009397ab426c6f636b53746f72656492cf1122334455667788cff1e2d3c4b5a69788c0940102030404c0a347505593ac426c6f636b52656d6f76656491cff1e2d3c4b5a69788a347505591b0416c6c426c6f636b73436c656172656400";
    const VLLM_0_24_0: &str = "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf1122334455667788cff1e2d3c4b5a69788b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cff1e2d3c4b5a69788a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";
    const SGLANG_0_5_23: &str = "93cb3ff80000000000009387a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391d3eeddef0b82167eebb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da347505583a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391d3eeddef0b82167eeba66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn store_remove_clear(hs: &[u64], removed: u64) -> Vec<KvEvent> {
        vec![
            KvEvent::Stored {
                block_hashes: hs.to_vec(),
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 4,
            },
            KvEvent::Removed {
                block_hashes: vec![removed],
            },
            KvEvent::Cleared,
        ]
    }

    #[test]
    fn vllm_encodings_match_the_releases_bytes() {
        let events = store_remove_clear(
            &[0x1122_3344_5566_7788, 0xF1E2_D3C4_B5A6_9788],
            0xF1E2_D3C4_B5A6_9788,
        );
        let array = encode_batch(KvEventsFormat::VllmArray, 1.5, &events, 0).unwrap();
        assert_eq!(hex(&array), VLLM_0_10_2);
        let map = encode_batch(KvEventsFormat::VllmMap, 1.5, &events, 0).unwrap();
        assert_eq!(hex(&map), VLLM_0_24_0);
    }

    #[test]
    fn sglang_encoding_matches_the_release_bytes_with_signed_hashes() {
        let h = (-1_234_567_890_123_456_789_i64) as u64;
        let events = store_remove_clear(&[h], h);
        let bytes = encode_batch(KvEventsFormat::Sglang, 1.5, &events, 0).unwrap();
        assert_eq!(hex(&bytes), SGLANG_0_5_23);
    }

    #[test]
    fn formats_parse_by_name_and_reject_others() {
        for f in [
            KvEventsFormat::VllmMap,
            KvEventsFormat::VllmArray,
            KvEventsFormat::Sglang,
        ] {
            assert_eq!(f.as_str().parse::<KvEventsFormat>(), Ok(f));
        }
        let err = "vllm".parse::<KvEventsFormat>().unwrap_err();
        assert!(err.contains("vllm-map"), "{err}");
    }
}
