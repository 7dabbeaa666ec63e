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

use super::msgpack::{Item, MsgpackError, Reader};

/// Deepest nesting a batch may have (the real ones nest 5 levels: batch,
/// events, event, `extra_keys`, a key tuple).
pub const MAX_DEPTH: usize = 16;

/// Events reserved up front for a batch's list (more grow as they come).
const RESERVE_EVENTS: usize = 256;
/// Hashes or token ids reserved up front for one list.
const RESERVE_IDS: usize = 1 << 16;

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

/// Decodes one payload frame, in one pass over its bytes.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, WireError> {
    let mut reader = Reader::new(payload);
    let batch = read_batch(&mut reader)?;
    if reader.remaining() > 0 {
        return Err(WireError::Trailing(reader.remaining()));
    }
    Ok(batch)
}

fn malformed(e: MsgpackError) -> WireError {
    WireError::Msgpack(e.to_string())
}

/// The nesting a value at `level` may have, itself included (the batch is
/// level 1; no container may sit deeper than level [`MAX_DEPTH`]).
fn room(level: usize) -> usize {
    (MAX_DEPTH + 1).saturating_sub(level)
}

/// Reads one value at `level` that should be a scalar: its head, with a
/// container's contents skipped (the caller sees `Array`/`Map` and treats
/// it as the wrong type).
fn scalar<'a>(reader: &mut Reader<'a>, level: usize) -> Result<Item<'a>, WireError> {
    let head = reader.item().map_err(malformed)?;
    reader.skip_contents(head, room(level)).map_err(malformed)?;
    Ok(head)
}

fn read_batch(reader: &mut Reader<'_>) -> Result<EventBatch, WireError> {
    const LEVEL: usize = 2;
    let (mut ts, mut events, mut rank, mut attn_rank) = (None, None, None, None);
    match reader.item().map_err(malformed)? {
        Item::Array(n) => {
            for position in 0..n {
                match position {
                    0 => ts = Some(scalar(reader, LEVEL)?),
                    1 => events = Some(read_events(reader)?),
                    2 => rank = Some(scalar(reader, LEVEL)?),
                    _ => reader.skip(room(LEVEL)).map_err(malformed)?,
                }
            }
        }
        Item::Map(n) => {
            for _ in 0..n {
                let key = scalar(reader, LEVEL)?;
                match key.as_str() {
                    Some("ts") if ts.is_none() => ts = Some(scalar(reader, LEVEL)?),
                    Some("events") if events.is_none() => events = Some(read_events(reader)?),
                    Some("data_parallel_rank") if rank.is_none() => {
                        rank = Some(scalar(reader, LEVEL)?)
                    }
                    Some("attn_dp_rank") if attn_rank.is_none() => {
                        attn_rank = Some(scalar(reader, LEVEL)?)
                    }
                    _ => reader.skip(room(LEVEL)).map_err(malformed)?,
                }
            }
        }
        _ => return Err(WireError::Shape("the batch is neither an array nor a map")),
    }
    let rank = rank.filter(|r| *r != Item::Nil).or(attn_rank);
    Ok(EventBatch {
        ts: ts.and_then(|t| t.as_f64()).filter(|t| t.is_finite()),
        events: events.ok_or(WireError::Shape("the batch has no event list"))??,
        dp_rank: rank
            .and_then(|r| r.as_u64())
            .and_then(|r| u32::try_from(r).ok()),
    })
}

/// The event list (level 2): its events, or why it is not a list. An
/// `Err` inside means the list was read whole but is not one; an `Err`
/// outside, that the bytes could not be read on.
fn read_events(reader: &mut Reader<'_>) -> Result<Result<Vec<KvEvent>, WireError>, WireError> {
    const LEVEL: usize = 2;
    let head = reader.item().map_err(malformed)?;
    let Item::Array(n) = head else {
        reader.skip_contents(head, room(LEVEL)).map_err(malformed)?;
        return Ok(Err(WireError::Shape("the batch has no event list")));
    };
    // Each event takes at least one byte: a count past the bytes left is
    // a lie, not a reason to reserve memory; and a frame's worth of
    // events is reserved as it arrives, not from its header.
    let mut events = Vec::with_capacity(n.min(reader.remaining()).min(RESERVE_EVENTS));
    for _ in 0..n {
        events.push(read_event(reader)?);
    }
    Ok(Ok(events))
}

/// The fields an event may carry, as read (a nil is the field's absence).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Tag,
    Hashes,
    Parent,
    Tokens,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    Group,
    SpecKind,
    /// Not read (an unknown name or position): skipped.
    Other,
}

impl Field {
    /// A map event's field by name (vLLM ≥ 0.24, SGLang ≥ 0.5.20).
    fn named(name: &str) -> Field {
        match name {
            "type" => Field::Tag,
            "block_hashes" => Field::Hashes,
            "parent_block_hash" => Field::Parent,
            "token_ids" => Field::Tokens,
            "block_size" => Field::BlockSize,
            "lora_id" => Field::LoraId,
            "medium" => Field::Medium,
            "lora_name" => Field::LoraName,
            "group_idx" => Field::Group,
            "kv_cache_spec_kind" => Field::SpecKind,
            _ => Field::Other,
        }
    }

    /// A positional event's field at `position` (1-based: the tag is 0),
    /// in vLLM's declaration order; SGLang's is the same for the fields it
    /// has.
    fn at(kind: Kind, position: usize) -> Field {
        match (kind, position) {
            (Kind::Stored, 1) | (Kind::Removed, 1) => Field::Hashes,
            (Kind::Stored, 2) => Field::Parent,
            (Kind::Stored, 3) => Field::Tokens,
            (Kind::Stored, 4) => Field::BlockSize,
            (Kind::Stored, 5) => Field::LoraId,
            (Kind::Stored, 6) | (Kind::Removed, 2) => Field::Medium,
            (Kind::Stored, 7) => Field::LoraName,
            (Kind::Stored, 9) | (Kind::Removed, 3) => Field::Group,
            (Kind::Stored, 10) => Field::SpecKind,
            _ => Field::Other,
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// An event's type, from its tag.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

impl Kind {
    fn of(tag: &str) -> Kind {
        match tag {
            "BlockStored" | "BlockStoredWithMetadata" => Kind::Stored,
            "BlockRemoved" => Kind::Removed,
            "AllBlocksCleared" => Kind::Cleared,
            _ => Kind::Unknown,
        }
    }
}

/// What one event's fields said, before its type decides what is needed.
/// A field of the wrong type is kept as the error it would be, because
/// whether it matters depends on the type (an unknown event's fields do
/// not), and a map may name its type last.
#[derive(Default)]
struct Raw<'a> {
    tag: Option<&'a str>,
    hashes: Option<Result<Vec<u64>, WireError>>,
    parent: Option<Result<u64, WireError>>,
    tokens: Option<Result<Vec<u32>, WireError>>,
    block_size: Option<u64>,
    lora_id: Option<i64>,
    /// `Some(None)`: sent, but not a string (no adapter name then, and no
    /// fallback to the id, as the engines mean it).
    lora_name: Option<Option<&'a str>>,
    medium: Option<Option<&'a str>>,
    group: Option<u64>,
    spec_kind: Option<&'a str>,
    /// Fields already read (a repeated map key keeps its first value).
    seen: u16,
}

/// Events (level 3) and their fields (level 4).
const EVENT_LEVEL: usize = 3;
const FIELD_LEVEL: usize = 4;

fn read_event(reader: &mut Reader<'_>) -> Result<KvEvent, WireError> {
    const NO_TAG: WireError = WireError::Shape("an event has no type tag");
    let mut raw = Raw::default();
    match reader.item().map_err(malformed)? {
        Item::Array(n) => {
            if n == 0 {
                return Err(NO_TAG);
            }
            let tag = scalar(reader, FIELD_LEVEL)?.as_str().ok_or(NO_TAG)?;
            raw.tag = Some(tag);
            let kind = Kind::of(tag);
            for position in 1..n {
                read_field(reader, Field::at(kind, position), &mut raw)?;
            }
        }
        Item::Map(n) => {
            for _ in 0..n {
                let field = scalar(reader, FIELD_LEVEL)?
                    .as_str()
                    .map_or(Field::Other, Field::named);
                read_field(reader, field, &mut raw)?;
            }
        }
        other => {
            reader
                .skip_contents(other, room(EVENT_LEVEL))
                .map_err(malformed)?;
            return Err(NO_TAG);
        }
    }
    raw.into_event()
}

/// Reads one field's value into `raw` (skipping it when it is not read,
/// or already was).
fn read_field<'a>(
    reader: &mut Reader<'a>,
    field: Field,
    raw: &mut Raw<'a>,
) -> Result<(), WireError> {
    if field == Field::Other || raw.seen & field.bit() != 0 {
        return reader.skip(room(FIELD_LEVEL)).map_err(malformed);
    }
    raw.seen |= field.bit();
    let head = reader.item().map_err(malformed)?;
    if head == Item::Nil {
        return Ok(());
    }
    match field {
        Field::Hashes => raw.hashes = Some(read_hashes(reader, head)?),
        Field::Tokens => raw.tokens = Some(read_tokens(reader, head)?),
        _ => {
            reader
                .skip_contents(head, room(FIELD_LEVEL))
                .map_err(malformed)?;
            match field {
                Field::Tag => raw.tag = head.as_str(),
                Field::Parent => {
                    raw.parent =
                        Some(hash_of(head).ok_or(WireError::Shape("a parent hash is not a hash")))
                }
                Field::BlockSize => raw.block_size = head.as_u64(),
                Field::LoraId => raw.lora_id = head.as_i64(),
                Field::LoraName => raw.lora_name = Some(head.as_str()),
                Field::Medium => raw.medium = Some(head.as_str()),
                Field::Group => raw.group = head.as_u64(),
                Field::SpecKind => raw.spec_kind = head.as_str(),
                Field::Hashes | Field::Tokens | Field::Other => {}
            }
        }
    }
    Ok(())
}

impl Raw<'_> {
    fn into_event(self) -> Result<KvEvent, WireError> {
        let Raw {
            tag,
            hashes,
            parent,
            tokens,
            block_size,
            lora_id,
            lora_name,
            medium,
            group,
            spec_kind,
            seen: _,
        } = self;
        let tag = tag.ok_or(WireError::Shape("an event has no type tag"))?;
        const NO_HASHES: WireError = WireError::Shape("an event has no block_hashes list");
        let on_gpu = medium.is_none_or(|m| m == Some(MEDIUM_GPU));
        Ok(match Kind::of(tag) {
            Kind::Stored => KvEvent::Stored(Stored {
                block_hashes: hashes.unwrap_or(Err(NO_HASHES))?,
                parent: parent.transpose()?,
                token_ids: tokens.transpose()?,
                block_size: block_size
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0),
                lora: match lora_name {
                    Some(name) => name.map(str::to_owned),
                    None => lora_id.map(|id| format!("lora-id:{id}")),
                },
                on_gpu,
                main_group: main_group(group, spec_kind),
            }),
            Kind::Removed => KvEvent::Removed(Removed {
                block_hashes: hashes.unwrap_or(Err(NO_HASHES))?,
                on_gpu,
                main_group: main_group(group, None),
            }),
            Kind::Cleared => KvEvent::AllCleared,
            Kind::Unknown => KvEvent::Unknown(tag.chars().take(64).collect()),
        })
    }
}

/// A block hash as a `u64` bit pattern: an int (either sign), or bytes by
/// their last 8 bytes big-endian (shorter ones left-padded with zeros).
pub fn hash_of(value: Item<'_>) -> Option<u64> {
    match value {
        Item::Uint(n) => Some(n),
        Item::Int(n) => Some(n as u64),
        Item::Bin(bytes) => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Some(tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        }
        _ => None,
    }
}

/// The hash list whose head is `head` (read whole even when an element is
/// not a hash, so the batch can be read on).
fn read_hashes(
    reader: &mut Reader<'_>,
    head: Item<'_>,
) -> Result<Result<Vec<u64>, WireError>, WireError> {
    let Item::Array(n) = head else {
        reader
            .skip_contents(head, room(FIELD_LEVEL))
            .map_err(malformed)?;
        return Ok(Err(WireError::Shape("an event has no block_hashes list")));
    };
    let mut out = Ok(Vec::with_capacity(
        n.min(reader.remaining()).min(RESERVE_IDS),
    ));
    for _ in 0..n {
        // Only while the list is good: `uint` consumes what it reads.
        if let Ok(list) = &mut out
            && let Some(hash) = reader.uint()
        {
            list.push(hash);
            continue;
        }
        let element = scalar(reader, FIELD_LEVEL + 1)?;
        match (&mut out, hash_of(element)) {
            (Ok(list), Some(hash)) => list.push(hash),
            (Ok(_), None) => out = Err(WireError::Shape("a block hash is not a hash")),
            (Err(_), _) => {}
        }
    }
    Ok(out)
}

/// The token list whose head is `head`: ints, or `[token, next]` pairs
/// (SGLang's EAGLE bigram pages; the first is the token).
fn read_tokens(
    reader: &mut Reader<'_>,
    head: Item<'_>,
) -> Result<Result<Vec<u32>, WireError>, WireError> {
    const NOT_A_TOKEN: WireError = WireError::Shape("a token id is not a 32-bit unsigned int");
    let Item::Array(n) = head else {
        reader
            .skip_contents(head, room(FIELD_LEVEL))
            .map_err(malformed)?;
        return Ok(Err(WireError::Shape("token_ids is not a list")));
    };
    let mut out = Ok(Vec::with_capacity(
        n.min(reader.remaining()).min(RESERVE_IDS),
    ));
    for _ in 0..n {
        if let Ok(list) = &mut out
            && let Some(token) = reader.uint()
        {
            match u32::try_from(token) {
                Ok(token) => list.push(token),
                Err(_) => out = Err(NOT_A_TOKEN),
            }
            continue;
        }
        let token = match reader.item().map_err(malformed)? {
            Item::Array(len) => {
                let mut first = None;
                for k in 0..len {
                    let element = scalar(reader, FIELD_LEVEL + 2)?;
                    if k == 0 {
                        first = element.as_u64();
                    }
                }
                first
            }
            Item::Map(len) => {
                reader
                    .skip_contents(Item::Map(len), room(FIELD_LEVEL + 1))
                    .map_err(malformed)?;
                None
            }
            scalar => scalar.as_u64(),
        };
        match (&mut out, token.and_then(|t| u32::try_from(t).ok())) {
            (Ok(list), Some(token)) => list.push(token),
            (Ok(_), None) => out = Err(NOT_A_TOKEN),
            (Err(_), _) => {}
        }
    }
    Ok(out)
}

/// Main attention group: a full-attention kind when the engine names the
/// kind, else group 0 (or no group: single-group models).
fn main_group(group: Option<u64>, kind: Option<&str>) -> bool {
    if let Some(kind) = kind {
        return matches!(
            kind,
            "full_attention" | "mla_attention" | "sink_full_attention"
        );
    }
    group.is_none_or(|g| g == 0)
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
