//! The push half of a load session: the node's rounds to one peer.
//!
//! After the session's `Hello`: the transcript (what every peer was told, as of
//! the last round) and the worker set, then every later round as the
//! outbox built it — the same bytes every link writes (see `outbox`) — and
//! this link's own worker-set repairs (the session's answers to the peer's
//! digests). A link that falls too far behind is sent the transcript again. On
//! shutdown: the last round, then `Bye`, so the peer stops counting us at
//! once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use quinn::{Connection, SendStream};
use shoal_proto::frames::Frame;
use tokio::sync::{broadcast, mpsc, watch};

use crate::core::Core;
use crate::outbox::Round;
use crate::wire::{StreamError, write_frame};
use crate::worker_frames::Encoded;

/// Timings of a link (the pace of its rounds is the node's, see `rounds`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LinkTimings {
    pub(crate) connect_timeout: Duration,
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

/// Writes `frames`, of which `set_bytes` are worker-set frames.
async fn write_all(
    core: &Core,
    stream: &mut SendStream,
    frames: &[Vec<u8>],
    set_bytes: usize,
) -> Result<(), StreamError> {
    let mut bytes = 0;
    for frame in frames {
        stream.write_all(frame).await?;
        bytes += frame.len();
    }
    core.telemetry.frames_sent(frames.len(), bytes);
    core.telemetry.worker_set_sent(set_bytes);
    Ok(())
}

/// Sends the transcript; returns the sequence the link's rounds continue after.
async fn send_transcript(core: &Core, stream: &mut SendStream) -> Result<u64, StreamError> {
    let copy = core.outbox.transcript_copy(core)?;
    write_all(core, stream, &copy.frames, copy.set_bytes).await?;
    Ok(copy.upto)
}

/// Writes `round` unless the transcript copy already covered it, in the
/// form the peer reads. Returns false if the round lacks that form (the
/// link then resyncs from a transcript copy).
async fn send_round(
    core: &Core,
    stream: &mut SendStream,
    round: &Round,
    upto: u64,
    peer_packs: bool,
) -> Result<bool, StreamError> {
    if round.seq <= upto {
        return Ok(true);
    }
    let Some(frames) = round.frames_for(peer_packs) else {
        return Ok(false);
    };
    write_all(core, stream, frames, round.set_bytes).await?;
    Ok(true)
}

/// Pushes the node's rounds, and the worker-set repairs the session hands
/// it in `repairs`, on `stream` (its `Hello` already sent) until the
/// connection fails or `stop` fires; on stop, sends the last round and
/// `Bye`, and finishes.
pub(crate) async fn push(
    core: &Core,
    conn: &Connection,
    stream: &mut SendStream,
    mut repairs: mpsc::Receiver<Encoded>,
    mut stop: watch::Receiver<bool>,
    peer_packs: &AtomicBool,
) -> Result<(), StreamError> {
    // Counted as needing whole values before subscribing, so every round
    // this link is fed has them until its peer says it packs.
    let mut whole = core.outbox.whole_link();
    // Subscribed before the copy: no round between the two is missed.
    let mut rounds = core.outbox.subscribe();
    let mut upto = send_transcript(core, stream).await?;
    let mut wire = WireMeter::default();
    let packs = |whole: &mut crate::outbox::WholeLink<'_>| {
        let packs = peer_packs.load(Ordering::Acquire);
        if packs {
            whole.release();
        }
        packs
    };
    loop {
        if *stop.borrow() {
            // Last changes first, then the goodbye.
            core.outbox.round(core)?;
            while let Ok(round) = rounds.try_recv() {
                if !send_round(core, stream, &round, upto, packs(&mut whole)).await? {
                    upto = send_transcript(core, stream).await?;
                }
            }
            let bytes = write_frame(stream, &Frame::Bye).await?;
            core.telemetry.frames_sent(1, bytes);
            let _ = stream.finish();
            let _ = tokio::time::timeout(crate::timings::BYE_FLUSH_WAIT, stream.stopped()).await;
            return Ok(());
        }
        tokio::select! {
            next = rounds.recv() => match next {
                Ok(round) => {
                    if !send_round(core, stream, &round, upto, packs(&mut whole)).await? {
                        // Built before this link counted (cannot happen:
                        // see `whole_link`); the copy puts it right.
                        core.telemetry.link_resync();
                        upto = send_transcript(core, stream).await?;
                    }
                    wire.record(core, conn);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too far behind to catch up round by round.
                    core.telemetry.link_resync();
                    upto = send_transcript(core, stream).await?;
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
            Some(repair) = repairs.recv() => {
                write_all(core, stream, &repair.frames, repair.bytes).await?;
            }
            changed = stop.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

/// Builds a round whenever the bell announces a change, and at least every
/// sync interval (a heartbeat, and the pace of the rolling refresh). Runs
/// until the node ends.
pub(crate) async fn rounds(core: Arc<Core>, sync: Duration) {
    let mut changes = core.changes.subscribe();
    loop {
        // The heartbeat is due one interval after the last round, and never
        // sooner than the push gap (or it would undo the gap's pacing).
        let heartbeat = sync.max(core.worker_keys.bell().gap());
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(heartbeat) => {}
        }
        if let Err(e) = core.outbox.round(&core) {
            tracing::warn!(error = %e, "mesh round could not be encoded");
        }
    }
}
