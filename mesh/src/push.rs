//! The push half of a load session: this node's own slots to one peer.
//!
//! After the session's `Hello`: a full copy of every touched slot, every
//! key this node polls and every own snapshot. Then, whenever the node's
//! change bell is announced (at once on a quiet node, at most once per
//! `push_min_gap` on a busy one; see `bell`) and at least every sync
//! interval, the slots whose values changed since the last push and the
//! snapshots not yet sent (coalesced: many bookings between two pushes
//! cost one entry); every anti-entropy interval a full copy again. On shutdown: `Bye`, so the peer stops counting us at
//! once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use quinn::{Connection, SendStream};
use shoal_proto::frames::{
    BasisEntry, Frame, KeyDef, SlotEntry, SnapshotEntry, Update, WorkerSetFrame,
};
use tokio::sync::watch;
use tokio::time::{MissedTickBehavior, interval};

use crate::core::Core;
use crate::identity::unix_micros;
use crate::slot::WorkerEntry;
use crate::wire::{StreamError, write_frame};

/// One push in this many carries the read time the receiver's lag
/// histogram needs (0, one byte on the wire, in the others).
const LAG_SAMPLE_EVERY: u64 = 8;

/// Entries per update frame, so a full copy never nears the frame limit.
const ENTRIES_PER_FRAME: usize = 1024;

/// Timings of a link.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkTimings {
    pub(crate) sync: Duration,
    pub(crate) anti_entropy: Duration,
    pub(crate) connect_timeout: Duration,
}

/// What this link told the peer about one wire id.
#[derive(Debug, Clone, Copy, Default)]
struct SentEntry {
    /// The entry the id named when this was sent (ids are reused).
    serial: u64,
    polled: bool,
    slot: Option<SlotEntry>,
    basis_ms: u64,
    snapshot_seq: u64,
}

/// What this link already told the peer, indexed by wire id (bounded by
/// the most keys this node held at once).
#[derive(Debug, Default)]
struct Sent {
    entries: Vec<Option<SentEntry>>,
    last_read_us: u64,
}

impl Sent {
    /// What was sent for `entry`'s id, if it was sent for this very entry.
    fn get(&mut self, entry: &WorkerEntry) -> Option<&mut SentEntry> {
        let id = entry.id as usize;
        if self.entries.len() <= id {
            self.entries.resize(id + 1, None);
        }
        self.entries
            .get_mut(id)?
            .as_mut()
            .filter(|s| s.serial == entry.serial)
    }

    fn set(&mut self, entry: &WorkerEntry, sent: SentEntry) {
        if let Some(slot) = self.entries.get_mut(entry.id as usize) {
            *slot = Some(sent);
        }
    }
}

/// Builds the update frames: every touched slot, polled key and own
/// snapshot when `full`, else only what changed since `sent`.
fn build(core: &Core, sent: &mut Sent, full: bool) -> Vec<Update> {
    let entries = core.registry.list();
    let read_at = unix_micros();
    let round = core.round.fetch_add(1, Ordering::Relaxed) + 1;
    let mut out = Vec::new();
    let mut cur = Update::default();
    for entry in entries.iter() {
        if entry.id == u32::MAX {
            continue;
        }
        let counts = entry.own.read();
        let slot = SlotEntry {
            id: entry.id,
            counts,
        };
        let basis_ms = entry.own.basis_ms.load(Ordering::Relaxed);
        let touched = entry.touched.load(Ordering::Relaxed);
        let polled = entry.polled.load(Ordering::Relaxed);
        let snapshot = **entry.own_snapshot.load();
        let prev = sent.get(entry).copied();
        let slot_due = match (&prev, full) {
            (_, true) | (None, false) => touched,
            (Some(p), false) => p.slot.map_or(touched, |s| s != slot),
        };
        let snap_due =
            snapshot.filter(|(seq, _)| full || prev.is_none_or(|p| p.snapshot_seq != *seq));
        // A basis only means something next to counts (an untouched slot
        // has no work since the poll), and must not keep a key alive.
        let basis_due =
            touched && basis_ms > 0 && (full || prev.is_none_or(|p| p.basis_ms != basis_ms));
        let polled_due = match &prev {
            Some(p) => (full && polled) || p.polled != polled,
            None => polled,
        };
        if !slot_due && !basis_due && snap_due.is_none() && !polled_due {
            continue;
        }
        if prev.is_none() || full || polled_due {
            cur.keys.push(KeyDef {
                id: entry.id,
                key: entry.key.to_string(),
                polled,
            });
        }
        let mut now_sent = prev.unwrap_or(SentEntry {
            serial: entry.serial,
            ..SentEntry::default()
        });
        now_sent.polled = polled;
        if slot_due {
            cur.slots.push(slot);
            now_sent.slot = Some(slot);
        }
        if basis_due {
            cur.bases.push(BasisEntry {
                id: entry.id,
                polled_at_unix_ms: basis_ms,
            });
            now_sent.basis_ms = basis_ms;
        }
        if let Some((seq, s)) = snap_due {
            cur.snapshots.push(SnapshotEntry {
                id: entry.id,
                source: s.source,
                load: s.load,
                polled_at_unix_ms: s.claimed_polled_at_ms,
            });
            now_sent.snapshot_seq = seq;
        }
        sent.set(entry, now_sent);
        if cur.keys.len() + cur.slots.len() + cur.bases.len() + cur.snapshots.len()
            >= ENTRIES_PER_FRAME
        {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    // The lag telemetry needs one sample in a few pushes, not 8 bytes in
    // every one (pushes on change are small: the field was ~15 % of them).
    let lag_sample = round.is_multiple_of(LAG_SAMPLE_EVERY) || full;
    for update in &mut out {
        update.round = round;
        update.prev_read_at_unix_us = if lag_sample { sent.last_read_us } else { 0 };
    }
    sent.last_read_us = read_at;
    out
}

async fn send_all(
    core: &Core,
    stream: &mut SendStream,
    updates: Vec<Update>,
) -> Result<(), StreamError> {
    for update in updates {
        let bytes = write_frame(stream, &Frame::Update(update)).await?;
        core.telemetry.frame_sent(bytes);
    }
    Ok(())
}

/// Sends the whole worker set when it changed since `sent_version` (or
/// always, when `full`), in frames of [`ENTRIES_PER_FRAME`] entries. The
/// set is small and changes rarely (admins), so a change resends it whole:
/// no per-link change tracking to get wrong.
async fn send_worker_set(
    core: &Core,
    stream: &mut SendStream,
    sent_version: &mut Option<u64>,
    full: bool,
) -> Result<(), StreamError> {
    let version = core.worker_set.version();
    if !full && *sent_version == Some(version) {
        return Ok(());
    }
    let entries = core.worker_set.lock().to_entries();
    *sent_version = Some(version);
    if entries.is_empty() && !full {
        return Ok(());
    }
    for chunk in entries.chunks(ENTRIES_PER_FRAME) {
        let frame = Frame::Workers(WorkerSetFrame {
            entries: chunk.to_vec(),
        });
        let bytes = write_frame(stream, &frame).await?;
        core.telemetry.frame_sent(bytes);
    }
    Ok(())
}

/// Feeds the UDP byte counts of a link's connection into the telemetry.
#[derive(Debug, Default)]
struct WireMeter {
    last: u64,
}

impl WireMeter {
    fn record(&mut self, core: &Core, conn: &Connection) {
        // Both ends of a session meter their own sends, so every byte on
        // the wire is counted once across the cluster.
        let total = conn.stats().udp_tx.bytes;
        core.telemetry.link_wire(total.saturating_sub(self.last));
        self.last = total;
    }
}

/// Pushes our slots on `stream` (its `Hello` already sent) until the
/// connection fails or `stop` fires; on stop, sends `Bye` and finishes.
pub(crate) async fn push(
    core: &Core,
    conn: &Connection,
    stream: &mut SendStream,
    timings: LinkTimings,
    mut stop: watch::Receiver<bool>,
) -> Result<(), StreamError> {
    let mut sent = Sent::default();
    let mut set_version = None;
    send_all(core, stream, build(core, &mut sent, true)).await?;
    send_worker_set(core, stream, &mut set_version, false).await?;
    let mut sync = interval(timings.sync);
    sync.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut full = interval(timings.anti_entropy);
    full.set_missed_tick_behavior(MissedTickBehavior::Delay);
    full.tick().await;
    let mut wire = WireMeter::default();
    let mut changes = core.changes.subscribe();
    loop {
        if *stop.borrow() {
            // Last changes first, then the goodbye.
            let updates = build(core, &mut sent, false);
            send_all(core, stream, updates).await?;
            let bytes = write_frame(stream, &Frame::Bye).await?;
            core.telemetry.frame_sent(bytes);
            let _ = stream.finish();
            let _ = tokio::time::timeout(crate::timings::BYE_FLUSH_WAIT, stream.stopped()).await;
            return Ok(());
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let updates = build(core, &mut sent, false);
                send_all(core, stream, updates).await?;
                send_worker_set(core, stream, &mut set_version, false).await?;
                wire.record(core, conn);
                // The periodic push is a heartbeat: due one interval after
                // the last push.
                sync.reset();
            }
            _ = sync.tick() => {
                let updates = build(core, &mut sent, false);
                send_all(core, stream, updates).await?;
                wire.record(core, conn);
            }
            _ = full.tick() => {
                let updates = build(core, &mut sent, true);
                send_all(core, stream, updates).await?;
                send_worker_set(core, stream, &mut set_version, true).await?;
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
