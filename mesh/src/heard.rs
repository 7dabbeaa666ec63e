//! What one inbound stream has said about each worker id (what was heard),
//! so packed slot changes (only the fields that changed) read back as
//! whole values.
//!
//! It belongs to one stream and follows it in order: every slot and
//! basis the stream carries, packed or not, overwrites the id's line, so
//! it always equals the sender's transcript as of the last frame read (the
//! sender packs against that transcript, and says every field whenever the
//! stream may not know it). What the merge sees is unchanged: whole slot
//! entries and bases in an [`Update`], applied last-writer-wins by round as
//! before, so the CRDT's semantics do not depend on the packing.

use std::collections::HashMap;

use shoal_proto::LoadCounts;
use shoal_proto::frames::{BasisEntry, PackedUpdate, SlotEntry, Update};
use shoal_proto::slot_pack::{self, BasisChange, PackError};

/// Most worker ids one stream's record holds: the most keys a node takes
/// from its peers (`worker_keys::MAX_REMOTE_KEYS`); an id past it would be
/// refused as a key anyway. Bounds what a faulty peer can make it hold.
const MAX_LINES: usize = crate::worker_keys::MAX_REMOTE_KEYS;

/// Most changes one packed frame may carry. A sender fills frames to
/// `FRAME_TARGET_BYTES` of whole-entry bounds (under 2,000 changes); a
/// frame with more is refused before anything is allocated for it.
pub(crate) const MAX_CHANGES_PER_FRAME: usize = 16_384;

/// Why a packed frame was not taken (it is dropped, counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnpackError {
    /// The changes do not decode (or are more than a frame may carry).
    #[error("{0}")]
    Pack(#[from] PackError),
    /// They name more worker ids than a stream's record holds.
    #[error("packed slot changes name more worker ids than a peer may use")]
    TooManyIds,
}

/// One id's last said values.
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    counts: LoadCounts,
    basis_ms: u64,
}

/// Per worker id, the stream's last said counts and basis.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    lines: HashMap<u32, Line>,
}

impl Heard {
    /// Records what a whole-value update says (a version-2 `Update`: the
    /// transcript copy, or a sender that does not pack).
    pub(crate) fn note(&mut self, update: &Update) {
        for slot in &update.slots {
            if let Some(line) = self.line(slot.id) {
                line.counts = slot.counts;
            }
        }
        for basis in &update.bases {
            if let Some(line) = self.line(basis.id) {
                line.basis_ms = basis.polled_at_unix_ms;
            }
        }
    }

    /// The line of `id`, created if there is room (see [`MAX_LINES`]).
    fn line(&mut self, id: u32) -> Option<&mut Line> {
        if self.lines.len() >= MAX_LINES && !self.lines.contains_key(&id) {
            return None;
        }
        Some(self.lines.entry(id).or_default())
    }

    /// The whole values a packed update stands for, recorded. A frame that
    /// does not unpack changes nothing (it is dropped, counted; the rolling
    /// refresh re-says every field within one anti-entropy interval).
    pub(crate) fn unpack(&mut self, packed: PackedUpdate) -> Result<Update, UnpackError> {
        let changes = slot_pack::unpack_at_most(&packed.slots, MAX_CHANGES_PER_FRAME)?;
        let new_ids = changes
            .iter()
            .filter(|c| !self.lines.contains_key(&c.id))
            .count();
        if self.lines.len() + new_ids > MAX_LINES {
            return Err(UnpackError::TooManyIds);
        }
        let mut slots = Vec::with_capacity(changes.len());
        let mut bases = Vec::new();
        for change in changes {
            let line = self.lines.entry(change.id).or_default();
            let c = &mut line.counts;
            let counted = [
                change.requests,
                change.tokens,
                change.pending_prefill,
                change.dispatched_since_poll,
            ]
            .iter()
            .any(Option::is_some);
            c.requests = change.requests.unwrap_or(c.requests);
            c.tokens = change.tokens.unwrap_or(c.tokens);
            c.pending_prefill = change.pending_prefill.unwrap_or(c.pending_prefill);
            c.dispatched_since_poll = change
                .dispatched_since_poll
                .unwrap_or(c.dispatched_since_poll);
            if counted {
                slots.push(SlotEntry {
                    id: change.id,
                    counts: *c,
                });
            }
            let basis = match change.basis {
                BasisChange::Same => None,
                BasisChange::Absolute(ms) => Some(ms),
                BasisChange::Later(ms) => Some(line.basis_ms.saturating_add(ms)),
            };
            if let Some(ms) = basis {
                line.basis_ms = ms;
                bases.push(BasisEntry {
                    id: change.id,
                    polled_at_unix_ms: ms,
                });
            }
        }
        Ok(Update {
            round: packed.round,
            prev_read_at_unix_us: packed.prev_read_at_unix_us,
            keys: packed.keys,
            slots,
            bases,
            snapshots: packed.snapshots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::slot_pack::SlotChange;

    fn packed(changes: &[SlotChange]) -> PackedUpdate {
        let mut slots = Vec::new();
        slot_pack::pack(changes, &mut slots);
        PackedUpdate {
            round: 3,
            slots,
            ..PackedUpdate::default()
        }
    }

    fn counts(requests: u64, tokens: u64, pending: u64, since: u64) -> LoadCounts {
        LoadCounts {
            requests,
            tokens,
            pending_prefill: pending,
            dispatched_since_poll: since,
        }
    }

    #[test]
    fn absent_fields_read_as_last_said_and_bases_add_up() {
        let mut heard = Heard::default();
        heard.note(&Update {
            slots: vec![SlotEntry {
                id: 4,
                counts: counts(1, 900, 600, 900),
            }],
            bases: vec![BasisEntry {
                id: 4,
                polled_at_unix_ms: 10_000,
            }],
            ..Update::default()
        });
        // First byte, then a rebase 1,000 ms later.
        let first_byte = heard
            .unpack(packed(&[SlotChange {
                id: 4,
                pending_prefill: Some(0),
                ..SlotChange::default()
            }]))
            .unwrap();
        assert_eq!(first_byte.round, 3);
        assert_eq!(first_byte.slots[0].counts, counts(1, 900, 0, 900));
        assert!(first_byte.bases.is_empty());
        let rebase = heard
            .unpack(packed(&[SlotChange {
                id: 4,
                dispatched_since_poll: Some(0),
                basis: BasisChange::Later(1_000),
                ..SlotChange::default()
            }]))
            .unwrap();
        assert_eq!(rebase.slots[0].counts, counts(1, 900, 0, 0));
        assert_eq!(rebase.bases[0].polled_at_unix_ms, 11_000);
        // A basis alone carries no slot entry (its counts did not change).
        let basis_only = heard
            .unpack(packed(&[SlotChange {
                id: 4,
                basis: BasisChange::Absolute(20_000),
                ..SlotChange::default()
            }]))
            .unwrap();
        assert!(basis_only.slots.is_empty());
        assert_eq!(basis_only.bases[0].polled_at_unix_ms, 20_000);
    }

    #[test]
    fn a_bad_frame_changes_nothing() {
        let mut heard = Heard::default();
        let whole = SlotChange {
            id: 1,
            requests: Some(2),
            tokens: Some(5),
            pending_prefill: Some(0),
            dispatched_since_poll: Some(5),
            basis: BasisChange::Same,
        };
        heard.unpack(packed(&[whole])).unwrap();
        let mut bad = packed(&[whole]);
        bad.slots.push(0x80);
        assert!(heard.unpack(bad).is_err());
        // More changes than a frame may carry: refused whole.
        let many: Vec<SlotChange> = (0..=MAX_CHANGES_PER_FRAME as u32)
            .map(|id| SlotChange {
                id,
                requests: Some(1),
                ..SlotChange::default()
            })
            .collect();
        assert_eq!(
            heard.unpack(packed(&many)),
            Err(UnpackError::Pack(PackError::TooMany))
        );
        let after = heard
            .unpack(packed(&[SlotChange {
                id: 1,
                requests: Some(1),
                ..SlotChange::default()
            }]))
            .unwrap();
        assert_eq!(after.slots[0].counts, counts(1, 5, 0, 5));
    }
}
