//! A round's update frames as they fill: whole values (what every version-2
//! build reads) and, side by side, the same slots packed field by field
//! against the transcript (see `shoal_proto::slot_pack`), split into frames
//! by size at the same worker boundaries.

use shoal_proto::LoadCounts;
use shoal_proto::frame_size::{EncodedLenBound, FRAME_TARGET_BYTES};
use shoal_proto::frames::{
    BasisEntry, Frame, FrameError, KeyDef, PackedUpdate, SlotEntry, SnapshotEntry, Update,
    encode_prefixed,
};
use shoal_proto::slot_pack::{self, BasisChange, SlotChange};

use super::Told;
use crate::slot::WorkerEntry;
use crate::state::SnapshotValue;

/// A round's frames in both forms: packed, and whole values if asked for.
pub(super) struct Forms {
    pub(super) packed: Vec<Vec<u8>>,
    pub(super) whole: Option<Vec<Vec<u8>>>,
}

/// Update frames being filled, split by the entries' encoded size (see
/// `shoal_proto::frame_size`): a worker's entries stay in one frame, so a
/// key definition always travels with, or before, the entries using it.
#[derive(Default)]
pub(super) struct Batch {
    done: Vec<(Update, Vec<SlotChange>)>,
    /// The frame being filled, with whole values.
    cur: Update,
    /// The same frame's slots and bases as packed changes.
    cur_changes: Vec<SlotChange>,
    /// Bound of the bytes of `cur`'s entries.
    cur_bytes: usize,
}

impl Batch {
    fn key(&mut self, def: KeyDef) {
        self.cur_bytes += def.encoded_len_bound();
        self.cur.keys.push(def);
    }

    fn slot(&mut self, slot: SlotEntry) {
        self.cur_bytes += slot.encoded_len_bound();
        self.cur.slots.push(slot);
    }

    fn change(&mut self, change: SlotChange) {
        self.cur_changes.push(change);
    }

    fn basis(&mut self, basis: BasisEntry) {
        self.cur_bytes += basis.encoded_len_bound();
        self.cur.bases.push(basis);
    }

    fn snapshot(&mut self, snapshot: SnapshotEntry) {
        self.cur_bytes += snapshot.encoded_len_bound();
        self.cur.snapshots.push(snapshot);
    }

    /// One worker's entries are in: start a new frame if this one is full.
    fn entry_done(&mut self) {
        if self.cur_bytes >= FRAME_TARGET_BYTES {
            let frame = std::mem::take(&mut self.cur);
            self.done
                .push((frame, std::mem::take(&mut self.cur_changes)));
            self.cur_bytes = 0;
        }
    }

    /// Every entry of `told` for `entry` (a transcript copy or a refresh).
    pub(super) fn all_of(&mut self, entry: &WorkerEntry, told: &Told) {
        self.key(KeyDef {
            id: entry.id,
            key: entry.key.to_string(),
            polled: told.polled,
        });
        if let Some(counts) = told.slot {
            self.slot(SlotEntry {
                id: entry.id,
                counts,
            });
            let mut change = whole_change(entry.id, &counts);
            if told.basis_ms > 0 {
                self.basis(BasisEntry {
                    id: entry.id,
                    polled_at_unix_ms: told.basis_ms,
                });
                change.basis = BasisChange::Absolute(told.basis_ms);
            }
            self.change(change);
        }
        if let Some((_, s)) = told.snapshot {
            self.snapshot(snapshot_entry(entry.id, &s));
        }
        self.entry_done();
    }

    /// The frames in the order they fill, each stamped with `round`.
    fn frames(mut self, round: u64, prev_read_us: u64) -> Vec<(Update, Vec<SlotChange>)> {
        if !self.cur.is_empty() {
            self.done.push((self.cur, self.cur_changes));
        }
        for (update, _) in &mut self.done {
            update.round = round;
            update.prev_read_at_unix_us = prev_read_us;
        }
        self.done
    }

    /// Encodes the frames with whole values (what every version-2 build
    /// reads: the transcript copy, and links whose peer does not pack).
    pub(super) fn encode(self, round: u64, prev_read_us: u64) -> Result<Vec<Vec<u8>>, FrameError> {
        self.frames(round, prev_read_us)
            .into_iter()
            .map(|(update, _)| encode_prefixed(&Frame::Update(update)))
            .collect()
    }

    /// Encodes the frames packed, and with whole values too if `legacy`.
    pub(super) fn encode_both(
        self,
        round: u64,
        prev_read_us: u64,
        legacy: bool,
    ) -> Result<Forms, FrameError> {
        let frames = self.frames(round, prev_read_us);
        let whole = if legacy {
            Some(encode_whole(frames.iter().map(|(u, _)| u))?)
        } else {
            None
        };
        let packed = frames
            .into_iter()
            .map(|(update, changes)| {
                let mut slots = Vec::with_capacity(changes.len() * 8);
                slot_pack::pack(&changes, &mut slots);
                encode_prefixed(&Frame::Packed(PackedUpdate {
                    round: update.round,
                    prev_read_at_unix_us: update.prev_read_at_unix_us,
                    keys: update.keys,
                    slots,
                    snapshots: update.snapshots,
                }))
            })
            .collect::<Result<_, _>>()?;
        Ok(Forms { packed, whole })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.done.is_empty() && self.cur.is_empty()
    }
}

fn encode_whole<'a>(updates: impl Iterator<Item = &'a Update>) -> Result<Vec<Vec<u8>>, FrameError> {
    updates
        .map(|u| encode_prefixed(&Frame::Update(u.clone())))
        .collect()
}

/// A change that says every count.
fn whole_change(id: u32, counts: &LoadCounts) -> SlotChange {
    SlotChange {
        id,
        requests: Some(counts.requests),
        tokens: Some(counts.tokens),
        pending_prefill: Some(counts.pending_prefill),
        dispatched_since_poll: Some(counts.dispatched_since_poll),
        basis: BasisChange::Same,
    }
}

fn snapshot_entry(id: u32, s: &SnapshotValue) -> SnapshotEntry {
    SnapshotEntry {
        id,
        source: s.source,
        load: s.load,
        polled_at_unix_ms: s.claimed_polled_at_ms,
    }
}

/// The entries that tell a peer holding `prev` what `next` says.
pub(super) fn emit_changes(
    batch: &mut Batch,
    entry: &WorkerEntry,
    prev: Option<&Told>,
    next: &Told,
) {
    if prev.is_none_or(|p| p.polled != next.polled) {
        batch.key(KeyDef {
            id: entry.id,
            key: entry.key.to_string(),
            polled: next.polled,
        });
    }
    let mut change = SlotChange {
        id: entry.id,
        ..SlotChange::default()
    };
    if let Some(counts) = next.slot
        && prev.is_none_or(|p| p.slot != next.slot)
    {
        batch.slot(SlotEntry {
            id: entry.id,
            counts,
        });
        change = changed_fields(entry.id, prev.and_then(|p| p.slot), &counts);
    }
    if next.basis_ms > 0 && prev.is_none_or(|p| p.basis_ms != next.basis_ms) {
        batch.basis(BasisEntry {
            id: entry.id,
            polled_at_unix_ms: next.basis_ms,
        });
        // The stream last said the transcript's basis when it is not 0
        // (see `heard`); bases only grow.
        let told = prev.map_or(0, |p| p.basis_ms);
        change.basis = if told > 0 && next.basis_ms > told {
            BasisChange::Later(next.basis_ms - told)
        } else {
            BasisChange::Absolute(next.basis_ms)
        };
    }
    if !change.is_empty() {
        batch.change(change);
    }
    if let Some((seq, s)) = next.snapshot
        && prev.is_none_or(|p| p.snapshot.map(|x| x.0) != Some(seq))
    {
        batch.snapshot(snapshot_entry(entry.id, &s));
    }
    batch.entry_done();
}

/// The counts of `next` that differ from what the stream last said
/// (`told`), or all of them if it said none.
fn changed_fields(id: u32, told: Option<LoadCounts>, next: &LoadCounts) -> SlotChange {
    let Some(told) = told else {
        return whole_change(id, next);
    };
    let field = |was: u64, now: u64| (was != now).then_some(now);
    SlotChange {
        id,
        requests: field(told.requests, next.requests),
        tokens: field(told.tokens, next.tokens),
        pending_prefill: field(told.pending_prefill, next.pending_prefill),
        dispatched_since_poll: field(told.dispatched_since_poll, next.dispatched_since_poll),
        basis: BasisChange::Same,
    }
}
