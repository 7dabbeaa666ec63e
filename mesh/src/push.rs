//! The push half of a load session: this node's own slots to one peer.
//!
//! After the session's `Hello`: a full copy of every touched slot and every
//! own snapshot. Then, every sync interval, the slots whose values changed
//! since the last push and the snapshots not yet sent (coalesced: many
//! bookings in one interval cost one entry); every anti-entropy interval a
//! full copy again. On shutdown: `Bye`, so the peer stops counting us at
//! once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use quinn::{Connection, SendStream};
use shoal_proto::frames::{Frame, KeyDef, SlotEntry, SnapshotEntry, Update};
use tokio::sync::watch;
use tokio::time::{MissedTickBehavior, interval};

use crate::core::Core;
use crate::identity::unix_micros;
use crate::slot::SlotValues;
use crate::wire::{StreamError, write_frame};

/// Entries per update frame, so a full copy never nears the frame limit.
const ENTRIES_PER_FRAME: usize = 1024;

/// Timings of a link.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkTimings {
    pub(crate) sync: Duration,
    pub(crate) anti_entropy: Duration,
    pub(crate) connect_timeout: Duration,
}

/// What this link already told the peer, indexed by worker id.
#[derive(Debug, Default)]
struct Sent {
    defined: Vec<bool>,
    slots: Vec<Option<SlotValues>>,
    snapshot_seq: Vec<u64>,
    last_read_us: u64,
}

impl Sent {
    fn grow(&mut self, len: usize) {
        if self.defined.len() < len {
            self.defined.resize(len, false);
            self.slots.resize(len, None);
            self.snapshot_seq.resize(len, 0);
        }
    }
}

/// Builds the update frames: every touched slot when `full`, else only
/// what changed since `sent`.
fn build(core: &Core, sent: &mut Sent, full: bool) -> Vec<Update> {
    let entries = core.registry.list();
    sent.grow(entries.len());
    let read_at = unix_micros();
    let round = core.round.fetch_add(1, Ordering::Relaxed) + 1;
    let mut out = Vec::new();
    let mut cur = Update::default();
    for entry in entries.iter() {
        let id = entry.id as usize;
        let values = entry.own.read();
        let slot_due = if full {
            entry.touched.load(Ordering::Relaxed)
        } else {
            sent.slots
                .get(id)
                .copied()
                .flatten()
                .map_or(entry.touched.load(Ordering::Relaxed), |prev| prev != values)
        };
        let snapshot = **entry.own_snapshot.load();
        let snap_due = snapshot.filter(|s| full || sent.snapshot_seq.get(id) != Some(&s.seq));
        if !slot_due && snap_due.is_none() {
            continue;
        }
        if sent.defined.get(id) != Some(&true) || full {
            cur.keys.push(KeyDef {
                id: entry.id,
                key: entry.key.to_string(),
            });
            if let Some(d) = sent.defined.get_mut(id) {
                *d = true;
            }
        }
        if slot_due {
            cur.slots.push(SlotEntry {
                id: entry.id,
                requests: values.requests,
                tokens: values.tokens,
                pending_prefill: values.pending_prefill,
                dispatched: values.dispatched,
            });
            if let Some(s) = sent.slots.get_mut(id) {
                *s = Some(values);
            }
        }
        if let Some(s) = snap_due {
            cur.snapshots.push(SnapshotEntry {
                id: entry.id,
                source: s.source,
                load: s.load,
                polled_at_unix_ms: s.polled_at_unix_ms,
                dispatched_mark: s.dispatched_mark,
            });
            if let Some(seq) = sent.snapshot_seq.get_mut(id) {
                *seq = s.seq;
            }
        }
        if cur.slots.len() + cur.snapshots.len() >= ENTRIES_PER_FRAME {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    for update in &mut out {
        update.round = round;
        update.prev_read_at_unix_us = sent.last_read_us;
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
    send_all(core, stream, build(core, &mut sent, true)).await?;
    let mut sync = interval(timings.sync);
    sync.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut full = interval(timings.anti_entropy);
    full.set_missed_tick_behavior(MissedTickBehavior::Delay);
    full.tick().await;
    let mut wire = WireMeter::default();
    loop {
        if *stop.borrow() {
            // Last changes first, then the goodbye.
            let updates = build(core, &mut sent, false);
            send_all(core, stream, updates).await?;
            let bytes = write_frame(stream, &Frame::Bye).await?;
            core.telemetry.frame_sent(bytes);
            let _ = stream.finish();
            let _ = tokio::time::timeout(Duration::from_millis(500), stream.stopped()).await;
            return Ok(());
        }
        tokio::select! {
            _ = sync.tick() => {
                let updates = build(core, &mut sent, false);
                send_all(core, stream, updates).await?;
                wire.record(core, conn);
            }
            _ = full.tick() => {
                let updates = build(core, &mut sent, true);
                send_all(core, stream, updates).await?;
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}
