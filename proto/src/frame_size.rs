//! Upper bounds of the bytes frame entries take on the wire, so a sender
//! splits a batch into frames by size without encoding anything twice.
//!
//! A sender fills a frame until its entries' bounds reach
//! [`FRAME_TARGET_BYTES`] and starts the next one; an entry never straddles
//! two frames, so a frame is at most the target plus one worker's entries
//! (a few KiB) plus the frame's own fields — far below
//! [`crate::frames::MAX_FRAME_BYTES`], whatever the entries hold. Entry
//! counts alone do not bound bytes: 1,024 worker URLs of
//! [`crate::frames::MAX_KEY_BYTES`] are 2 MiB.

use crate::frames::{BasisEntry, KeyDef, SlotEntry, SnapshotEntry, WorkerSetEntry};

/// Bytes of entries a sender puts in one frame before starting another.
pub const FRAME_TARGET_BYTES: usize = 64 * 1024;

/// Most bytes of a varint `u64` (bincode's standard config: a marker byte
/// and eight bytes).
const U64: usize = 9;
/// Most bytes of a varint `u32` (a marker byte and four bytes).
const U32: usize = 5;
/// A string: its length as a varint, then its bytes.
const fn string(len: usize) -> usize {
    U64 + len
}

/// An entry that knows the most bytes its encoding takes.
pub trait EncodedLenBound {
    /// Bytes the entry's encoding takes at most.
    fn encoded_len_bound(&self) -> usize;
}

impl EncodedLenBound for KeyDef {
    fn encoded_len_bound(&self) -> usize {
        U32 + string(self.key.len()) + 1
    }
}

/// Most bytes of a [`SlotEntry`]: its id and four counts.
pub const SLOT_ENTRY_MAX_BYTES: usize = U32 + 4 * U64;

impl EncodedLenBound for SlotEntry {
    fn encoded_len_bound(&self) -> usize {
        SLOT_ENTRY_MAX_BYTES
    }
}

/// Most bytes of a [`BasisEntry`]: its id and a poll time.
pub const BASIS_ENTRY_MAX_BYTES: usize = U32 + U64;

impl EncodedLenBound for BasisEntry {
    fn encoded_len_bound(&self) -> usize {
        BASIS_ENTRY_MAX_BYTES
    }
}

/// Most bytes of a [`SnapshotEntry`]: its id, the engine kind, five
/// optional numbers (a tag byte and at most eight bytes each) and a poll
/// time.
pub const SNAPSHOT_ENTRY_MAX_BYTES: usize = U32 + U32 + 5 * (1 + U64) + U64;

impl EncodedLenBound for SnapshotEntry {
    fn encoded_len_bound(&self) -> usize {
        SNAPSHOT_ENTRY_MAX_BYTES
    }
}

impl EncodedLenBound for WorkerSetEntry {
    fn encoded_len_bound(&self) -> usize {
        string(self.url.len()) + U64 + string(self.origin.len()) + 1
    }
}

/// Splits `items` into runs whose bounds sum to at least
/// [`FRAME_TARGET_BYTES`] each (the last run holds the rest).
pub fn chunks_by_size<T: EncodedLenBound>(items: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut end = 0;
        while end < rest.len() && bytes < FRAME_TARGET_BYTES {
            bytes += rest[end].encoded_len_bound();
            end += 1;
        }
        let (run, tail) = rest.split_at(end);
        rest = tail;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counts::LoadCounts;
    use crate::frames::{Frame, MAX_FRAME_BYTES, MAX_KEY_BYTES, Update, WorkerSetFrame, encode};
    use crate::load::{EngineKind, EngineLoad};

    fn largest_update() -> Update {
        Update {
            round: u64::MAX,
            prev_read_at_unix_us: u64::MAX,
            ..Update::default()
        }
    }

    #[test]
    fn bounds_hold_for_the_largest_values() {
        let key = KeyDef {
            id: u32::MAX,
            key: "k".repeat(MAX_KEY_BYTES),
            polled: true,
        };
        let slot = SlotEntry {
            id: u32::MAX,
            counts: LoadCounts {
                requests: u64::MAX,
                tokens: u64::MAX,
                pending_prefill: u64::MAX,
                dispatched_since_poll: u64::MAX,
            },
        };
        let basis = BasisEntry {
            id: u32::MAX,
            polled_at_unix_ms: u64::MAX,
        };
        let snapshot = SnapshotEntry {
            id: u32::MAX,
            source: EngineKind::Llamacpp,
            load: EngineLoad {
                token_usage: Some(1.0),
                waiting_requests: Some(u64::MAX),
                queued_tokens: Some(u64::MAX),
                running_requests: Some(u64::MAX),
                gen_throughput: Some(f64::MAX),
            },
            polled_at_unix_ms: u64::MAX,
        };
        // What one entry adds to an empty update (a vector's length is
        // one byte for 0 or 1 entries).
        let base = encode(&Frame::Update(Update::default())).unwrap().len();
        let one = |u: Update| encode(&Frame::Update(u)).unwrap().len() - base;
        assert!(
            one(Update {
                keys: vec![key.clone()],
                ..Update::default()
            }) <= key.encoded_len_bound()
        );
        assert!(
            one(Update {
                slots: vec![slot],
                ..Update::default()
            }) <= slot.encoded_len_bound()
        );
        assert!(
            one(Update {
                bases: vec![basis],
                ..Update::default()
            }) <= basis.encoded_len_bound()
        );
        assert!(
            one(Update {
                snapshots: vec![snapshot.clone()],
                ..Update::default()
            }) <= snapshot.encoded_len_bound()
        );
        let entry = WorkerSetEntry {
            url: "u".repeat(MAX_KEY_BYTES),
            hlc_us: u64::MAX,
            origin: "o".repeat(253),
            present: true,
        };
        let empty = encode(&Frame::Workers(WorkerSetFrame::default()))
            .unwrap()
            .len();
        let with = encode(&Frame::Workers(WorkerSetFrame {
            entries: vec![entry.clone()],
        }))
        .unwrap()
        .len();
        assert!(with - empty <= entry.encoded_len_bound());
        // A frame filled to the target plus one more of the largest
        // worker's entries, with the largest frame fields, encodes.
        let mut full = largest_update();
        let mut bytes = 0;
        while bytes < FRAME_TARGET_BYTES {
            full.keys.push(key.clone());
            full.slots.push(slot);
            full.bases.push(basis);
            full.snapshots.push(snapshot.clone());
            bytes += key.encoded_len_bound()
                + SLOT_ENTRY_MAX_BYTES
                + BASIS_ENTRY_MAX_BYTES
                + SNAPSHOT_ENTRY_MAX_BYTES;
        }
        let encoded = encode(&Frame::Update(full)).unwrap().len();
        assert!(encoded <= FRAME_TARGET_BYTES + 4 * 1024, "{encoded}");
        assert!(encoded < MAX_FRAME_BYTES / 8);
    }

    #[test]
    fn chunks_fill_to_the_target_and_keep_every_item() {
        let entries: Vec<WorkerSetEntry> = (0..600)
            .map(|i| WorkerSetEntry {
                url: format!("{i:0>2000}"),
                hlc_us: i,
                origin: "a".into(),
                present: true,
            })
            .collect();
        let runs: Vec<&[WorkerSetEntry]> = chunks_by_size(&entries).collect();
        assert_eq!(runs.iter().map(|r| r.len()).sum::<usize>(), 600);
        for run in &runs {
            let frame = Frame::Workers(WorkerSetFrame {
                entries: run.to_vec(),
            });
            let len = encode(&frame).unwrap().len();
            assert!(len <= FRAME_TARGET_BYTES + 2100, "{len}");
        }
        assert!(runs.len() >= 18, "{} runs", runs.len());
        assert_eq!(chunks_by_size::<WorkerSetEntry>(&[]).count(), 0);
    }
}
