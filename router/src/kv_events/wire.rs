//! Decoding the engines' KV-cache event batches (vLLM and SGLang).
//!
//! Both engines publish msgspec-encoded msgpack; `WIRE.md` next to this
//! file records the exact layouts and the releases read. What varies, and
//! what this decoder accepts:
//!
//! - the batch is an array `[ts, events, dp_rank?]` (2 elements in vLLM
//!   0.9.0, 3 since); a map `{ts, events, data_parallel_rank}` is accepted
//!   too (a main-branch state of vLLM had it);
//! - each event is either positional, `["BlockStored", f1, f2, ...]`
//!   (vLLM ≤ 0.23, SGLang ≤ 0.5.19; the array grows a field per release),
//!   or a map tagged by `type` (vLLM ≥ 0.24, SGLang ≥ 0.5.20; fields left
//!   at their default are omitted). Both may appear in one batch;
//! - block hashes are ints (signed or unsigned 64-bit) or bytes (vLLM with
//!   `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`): all become a `u64` bit
//!   pattern, bytes by their last 8 bytes big-endian — what the same vLLM
//!   would have sent in int mode;
//! - `token_ids` are ints, or pairs for SGLang's EAGLE bigram pages (the
//!   first element is the token).
//!
//! Unknown fields and extra trailing elements are ignored (a newer engine
//! adds fields); an unknown event type is kept as [`KvEvent::Unknown`] so
//! it is counted, not fatal. A batch that is not msgpack, nests deeper than
//! [`MAX_DEPTH`], has trailing bytes, or lacks a required field is an
//! error: the caller drops and counts it. Nothing here panics on input.

use rmpv::Value;

/// Deepest nesting a batch may have (the real ones nest 5 levels: batch,
/// events, event, `extra_keys`, a key tuple).
pub const MAX_DEPTH: usize = 16;

/// The medium vLLM and SGLang name the GPU block pool; events about other
/// tiers (CPU offload, storage) are not what a prefill can hit directly.
const MEDIUM_GPU: &str = "GPU";

/// One decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// The publisher's wall-clock time, if it sent a finite one.
    pub ts: Option<f64>,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// The data-parallel rank the batch came from, when the engine says.
    pub dp_rank: Option<u32>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks were filled and can be hit by later prompts.
    Stored(Stored),
    /// Blocks were evicted.
    Removed(Removed),
    /// The engine dropped its whole prefix cache.
    AllCleared,
    /// An event type this decoder does not know (counted, skipped).
    Unknown(String),
}

/// A `BlockStored` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The engine's chained hash of each new block.
    pub block_hashes: Vec<u64>,
    /// The engine's hash of the block before the first new one; `None`
    /// when the run starts at the first block of a prompt.
    pub parent: Option<u64>,
    /// The tokens of the new blocks, concatenated (`None`: the engine did
    /// not send them, and the blocks cannot be matched to prompts).
    pub token_ids: Option<Vec<u32>>,
    /// Tokens per block, as the engine says.
    pub block_size: Option<u32>,
    /// The adapter the blocks were computed with: its name when sent,
    /// else its numeric id.
    pub lora: Option<String>,
    /// Whether the blocks are in the GPU pool (a missing medium is GPU:
    /// releases before the field had only that pool).
    pub on_gpu: bool,
    /// Whether the blocks belong to the model's main attention group
    /// (hybrid models publish other groups whose hashes skip blocks).
    pub main_group: bool,
}

/// A `BlockRemoved` event.
#[derive(Debug, Clone, PartialEq)]
pub struct Removed {
    /// The engine's hashes of the evicted blocks.
    pub block_hashes: Vec<u64>,
    /// Whether the blocks left the GPU pool.
    pub on_gpu: bool,
    /// Whether the blocks belong to the main attention group.
    pub main_group: bool,
}

/// Why a batch could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not one msgpack value (or nested deeper than [`MAX_DEPTH`]).
    #[error("not msgpack: {0}")]
    Msgpack(String),
    /// Bytes after the batch.
    #[error("{0} trailing bytes after the batch")]
    Trailing(usize),
    /// A required part is missing or of the wrong type.
    #[error("malformed batch: {0}")]
    Shape(&'static str),
}

/// Decodes one payload frame.
pub fn decode_batch(mut payload: &[u8]) -> Result<EventBatch, WireError> {
    let value = rmpv::decode::read_value_with_max_depth(&mut payload, MAX_DEPTH)
        .map_err(|e| WireError::Msgpack(e.to_string()))?;
    if !payload.is_empty() {
        return Err(WireError::Trailing(payload.len()));
    }
    let (ts, events, rank) = match &value {
        Value::Array(items) => (items.first(), items.get(1), items.get(2)),
        Value::Map(_) => (
            map_get(&value, "ts"),
            map_get(&value, "events"),
            map_get(&value, "data_parallel_rank").or_else(|| map_get(&value, "attn_dp_rank")),
        ),
        _ => return Err(WireError::Shape("the batch is neither an array nor a map")),
    };
    let Some(Value::Array(raw_events)) = events else {
        return Err(WireError::Shape("the batch has no event list"));
    };
    let events = raw_events
        .iter()
        .map(decode_event)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EventBatch {
        ts: ts.and_then(Value::as_f64).filter(|t| t.is_finite()),
        events,
        dp_rank: rank
            .and_then(Value::as_u64)
            .and_then(|r| u32::try_from(r).ok()),
    })
}

/// The value under `key` in a msgpack map.
fn map_get<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    match value {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// An event's fields, whichever encoding it came in.
struct Fields<'a>(&'a Value);

impl<'a> Fields<'a> {
    /// The event's type tag.
    fn tag(&self) -> Option<&'a str> {
        match self.0 {
            Value::Array(items) => items.first()?.as_str(),
            Value::Map(_) => map_get(self.0, "type")?.as_str(),
            _ => None,
        }
    }

    /// Field `name`, declared at `position` (1-based: position 0 is the
    /// tag) in the positional encoding. A nil is the field's absence.
    fn get(&self, position: usize, name: &str) -> Option<&'a Value> {
        let value = match self.0 {
            Value::Array(items) => items.get(position),
            Value::Map(_) => map_get(self.0, name),
            _ => None,
        }?;
        (!value.is_nil()).then_some(value)
    }
}

// Field positions in the positional encoding (vLLM's declaration order;
// SGLang's is the same for the fields it has).
const STORED_HASHES: usize = 1;
const STORED_PARENT: usize = 2;
const STORED_TOKENS: usize = 3;
const STORED_BLOCK_SIZE: usize = 4;
const STORED_LORA_ID: usize = 5;
const STORED_MEDIUM: usize = 6;
const STORED_LORA_NAME: usize = 7;
const STORED_GROUP: usize = 9;
const STORED_SPEC_KIND: usize = 10;
const REMOVED_HASHES: usize = 1;
const REMOVED_MEDIUM: usize = 2;
const REMOVED_GROUP: usize = 3;

fn decode_event(value: &Value) -> Result<KvEvent, WireError> {
    let fields = Fields(value);
    let Some(tag) = fields.tag() else {
        return Err(WireError::Shape("an event has no type tag"));
    };
    Ok(match tag {
        "BlockStored" | "BlockStoredWithMetadata" => KvEvent::Stored(Stored {
            block_hashes: hashes(fields.get(STORED_HASHES, "block_hashes"))?,
            parent: match fields.get(STORED_PARENT, "parent_block_hash") {
                None => None,
                Some(v) => Some(hash(v).ok_or(WireError::Shape("a parent hash is not a hash"))?),
            },
            token_ids: fields
                .get(STORED_TOKENS, "token_ids")
                .map(tokens)
                .transpose()?,
            block_size: fields
                .get(STORED_BLOCK_SIZE, "block_size")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0),
            lora: lora(&fields),
            on_gpu: on_gpu(fields.get(STORED_MEDIUM, "medium")),
            main_group: main_group(
                fields.get(STORED_GROUP, "group_idx"),
                fields.get(STORED_SPEC_KIND, "kv_cache_spec_kind"),
            ),
        }),
        "BlockRemoved" => KvEvent::Removed(Removed {
            block_hashes: hashes(fields.get(REMOVED_HASHES, "block_hashes"))?,
            on_gpu: on_gpu(fields.get(REMOVED_MEDIUM, "medium")),
            main_group: main_group(fields.get(REMOVED_GROUP, "group_idx"), None),
        }),
        "AllBlocksCleared" => KvEvent::AllCleared,
        other => KvEvent::Unknown(other.chars().take(64).collect()),
    })
}

/// A block hash as a `u64` bit pattern: an int (either sign), or bytes by
/// their last 8 bytes big-endian (shorter ones left-padded with zeros).
pub fn hash(value: &Value) -> Option<u64> {
    match value {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|s| s as u64)),
        Value::Binary(bytes) => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        }
        _ => None,
    }
}

fn hashes(value: Option<&Value>) -> Result<Vec<u64>, WireError> {
    let Some(Value::Array(items)) = value else {
        return Err(WireError::Shape("an event has no block_hashes list"));
    };
    items
        .iter()
        .map(|v| hash(v).ok_or(WireError::Shape("a block hash is not a hash")))
        .collect()
}

fn tokens(value: &Value) -> Result<Vec<u32>, WireError> {
    let Value::Array(items) = value else {
        return Err(WireError::Shape("token_ids is not a list"));
    };
    items
        .iter()
        .map(|v| {
            // EAGLE pages send [token, next token] pairs.
            let token = match v {
                Value::Array(pair) => pair.first(),
                other => Some(other),
            };
            token
                .and_then(Value::as_u64)
                .and_then(|t| u32::try_from(t).ok())
                .ok_or(WireError::Shape("a token id is not a 32-bit unsigned int"))
        })
        .collect()
}

fn lora(fields: &Fields<'_>) -> Option<String> {
    if let Some(name) = fields.get(STORED_LORA_NAME, "lora_name") {
        return name.as_str().map(str::to_owned);
    }
    fields
        .get(STORED_LORA_ID, "lora_id")
        .and_then(Value::as_i64)
        .map(|id| format!("lora-id:{id}"))
}

fn on_gpu(medium: Option<&Value>) -> bool {
    medium.is_none_or(|m| m.as_str() == Some(MEDIUM_GPU))
}

/// Main attention group: a full-attention kind when the engine names the
/// kind, else group 0 (or no group: single-group models).
fn main_group(group: Option<&Value>, kind: Option<&Value>) -> bool {
    if let Some(kind) = kind.and_then(Value::as_str) {
        return matches!(
            kind,
            "full_attention" | "mla_attention" | "sink_full_attention"
        );
    }
    group.and_then(Value::as_u64).is_none_or(|g| g == 0)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
