//! Load sessions: one mutually authenticated QUIC connection per pair of
//! replicas, carrying one unidirectional stream each way. The replica with
//! the smaller name dials; both then send `Hello`, verify the other's, and
//! push their own slots while merging the peer's. Sharing one connection
//! lets each side's ACKs ride on its own data packets.
//!
//! A peer counts only after (1) rustls verified its certificate against the
//! cluster CA (as client or server), (2) its `Hello` is for our cluster, and
//! (3) that certificate is valid for the node name the `Hello` claims (and,
//! when we dialed, for the name we dialed). Anything else is dropped,
//! counted and closed. Frames that fail to decode are dropped and counted;
//! an oversized length prefix closes the session (framing is lost).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::mpsc;

use quinn::{Connection, Endpoint, Incoming, RecvStream};
use rustls_pki_types::CertificateDer;
use shoal_proto::frames::{
    Frame, Hello, MAX_OBJECTS_PER_FRAME, MAX_SIGHTINGS_PER_FRAME, MAX_TENANTS_PER_FRAME, Speaks,
    Update, WorkerDigestFrame,
};

use crate::core::{Core, LinkInfo};
use crate::heard::Heard;
use crate::identity::{Incarnation, valid_node_name};
use crate::push::{LinkTimings, push};
use crate::timings::{DIAL_BACKOFF_MAX, DIAL_BACKOFF_MIN, HELLO_TIMEOUT};
use crate::tls::cert_names_node;
use crate::wire::{Read, StreamError, read_frame, write_frame};
use crate::worker_frames::{self, Encoded};

/// True when this node dials `peer` (the other side waits to be dialed).
pub(crate) fn dials(me: &Incarnation, peer: &Incarnation) -> bool {
    me.name < peer.name
}

fn refuse(core: &Core, conn: &Connection, reason: &'static str) {
    core.telemetry.dropped(reason);
    conn.close(1u32.into(), reason.as_bytes());
}

/// Accepts sessions until the endpoint closes.
pub(crate) async fn accept_loop(core: Arc<Core>, endpoint: Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(accept(core.clone(), incoming));
    }
}

async fn accept(core: Arc<Core>, incoming: Incoming) {
    match tokio::time::timeout(HELLO_TIMEOUT, incoming).await {
        Ok(Ok(conn)) => session(&core, &conn, None).await,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "mesh inbound handshake failed");
            core.telemetry.dropped("handshake");
        }
        Err(_) => core.telemetry.dropped("handshake"),
    }
}

/// Keeps a session with `peer` at `addr` up until the task is aborted or
/// the mesh shuts down, reconnecting with backoff.
pub(crate) async fn dial_loop(
    core: Arc<Core>,
    endpoint: Endpoint,
    peer: Incarnation,
    addr: SocketAddr,
    timings: LinkTimings,
) {
    let mut backoff = DIAL_BACKOFF_MIN;
    let mut shutdown = core.shutdown.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connecting = match endpoint.connect(addr, &peer.name) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(peer = %peer, error = %e, "mesh connect refused");
                return;
            }
        };
        match tokio::time::timeout(timings.connect_timeout, connecting).await {
            Ok(Ok(conn)) => {
                backoff = DIAL_BACKOFF_MIN;
                session(&core, &conn, Some(&peer.name)).await;
            }
            Ok(Err(e)) => {
                tracing::debug!(peer = %peer, error = %e, "mesh handshake failed");
                core.telemetry.dropped("handshake");
            }
            Err(_) => tracing::debug!(peer = %peer, "mesh connect timed out"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(DIAL_BACKOFF_MAX);
    }
}

/// Sends our `Hello`, then reads and verifies the peer's.
async fn handshake(
    core: &Core,
    conn: &Connection,
    dialed: Option<&str>,
) -> Result<(quinn::SendStream, RecvStream, Incarnation), &'static str> {
    let leaf = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .and_then(|chain| chain.first().cloned())
        .ok_or("no_certificate")?;
    let mut send = conn.open_uni().await.map_err(|_| "no_hello")?;
    let hello = Frame::Hello(Hello {
        cluster_id: core.cluster_id.clone(),
        node: core.me.name.to_string(),
        generation: core.me.generation,
    });
    let bytes = write_frame(&mut send, &hello)
        .await
        .map_err(|_| "no_hello")?;
    core.telemetry.frames_sent(1, bytes);
    if core.speaks_packed {
        let speaks = Frame::Speaks(Speaks {
            features: Speaks::PACKED_SLOTS,
        });
        let bytes = write_frame(&mut send, &speaks)
            .await
            .map_err(|_| "no_hello")?;
        core.telemetry.frames_sent(1, bytes);
    }
    let read = async {
        let mut recv = conn.accept_uni().await.ok()?;
        match read_frame(&mut recv).await {
            Ok(Read::Frame(Frame::Hello(hello), bytes)) => Some((recv, hello, bytes)),
            _ => None,
        }
    };
    let (recv, hello, bytes) = tokio::time::timeout(HELLO_TIMEOUT, read)
        .await
        .ok()
        .flatten()
        .ok_or("no_hello")?;
    core.telemetry.frame_received(bytes);
    if hello.cluster_id != core.cluster_id {
        return Err("wrong_cluster");
    }
    let named = valid_node_name(&hello.node)
        && hello.node != *core.me.name
        && dialed.is_none_or(|d| d == hello.node)
        && cert_names_node(&leaf, &hello.node);
    if !named {
        tracing::warn!(claimed = %hello.node, "mesh peer certificate does not name it");
        return Err("unverified");
    }
    Ok((send, recv, Incarnation::new(hello.node, hello.generation)))
}

/// Runs one session on an established connection until either side ends.
async fn session(core: &Core, conn: &Connection, dialed: Option<&str>) {
    let (mut send, mut recv, peer) = match handshake(core, conn, dialed).await {
        Ok(ok) => ok,
        Err(reason) => {
            refuse(core, conn, reason);
            return;
        }
    };
    let conn_id = conn.stable_id();
    {
        let mut tables = core.tables();
        tables.links.insert(
            peer.clone(),
            LinkInfo {
                conn_id,
                remote: conn.remote_address(),
                last_frame: Instant::now(),
            },
        );
        core.refresh_membership(&mut tables);
    }
    tracing::info!(peer = %peer, "mesh peer verified");
    let shutdown = core.shutdown.subscribe();
    // One repair at a time: while one is being written, a digest asking
    // for another is answered by the next digest instead.
    let (repair_tx, repair_rx) = mpsc::channel(1);
    let mut repairs = Repairs {
        tx: repair_tx,
        last: None,
    };
    // Set when the peer says it reads packed updates (see `slot_pack`).
    let peer_packs = AtomicBool::new(false);
    tokio::select! {
        result = push(core, conn, &mut send, repair_rx, shutdown, &peer_packs) => {
            if let Err(e) = result {
                tracing::debug!(peer = %peer, error = %e, "mesh push ended");
            }
        }
        () = receive(core, conn, &peer, &mut recv, &mut repairs, &peer_packs) => {}
    }
    conn.close(0u32.into(), b"done");
    let mut tables = core.tables();
    if tables
        .links
        .get(&peer)
        .is_some_and(|l| l.conn_id == conn_id)
    {
        tables.links.remove(&peer);
    }
    core.refresh_membership(&mut tables);
}

/// This link's answers to the peer's worker-set digests.
struct Repairs {
    tx: mpsc::Sender<Encoded>,
    /// When the last digest was answered.
    last: Option<Instant>,
}

impl Repairs {
    /// Sends the peer this node's entries of the buckets where its digest
    /// differs. A peer sends one digest per anti-entropy interval; one
    /// arriving sooner than half of that after the last is dropped,
    /// counted, so a peer cannot make this node resend its set at will.
    fn answer(&mut self, core: &Core, digest: &WorkerDigestFrame) {
        let gap = core.outbox.refresh_every() / 2;
        if self.last.is_some_and(|last| last.elapsed() < gap) {
            core.telemetry.dropped("worker_digest_early");
            return;
        }
        let Some(entries) = core.worker_set.lock().repair_for(&digest.buckets) else {
            core.telemetry.dropped("worker_digest_shape");
            return;
        };
        self.last = Some(Instant::now());
        if entries.is_empty() {
            return;
        }
        match worker_frames::entries(&entries) {
            // Full: a repair is still being written; the next digest asks
            // again.
            Ok(repair) => {
                let _ = self.tx.try_send(repair);
            }
            Err(e) => tracing::warn!(error = %e, "worker-set repair could not be encoded"),
        }
    }
}

/// Merges the peer's frames until its stream ends, it says `Bye`, or its
/// framing breaks.
async fn receive(
    core: &Core,
    conn: &Connection,
    peer: &Incarnation,
    recv: &mut RecvStream,
    repairs: &mut Repairs,
    peer_packs: &AtomicBool,
) {
    let mut dict: HashMap<u32, Arc<str>> = HashMap::new();
    let mut heard = Heard::default();
    let merge = |dict: &mut HashMap<u32, Arc<str>>, update: Update| {
        #[cfg(feature = "testsuite")]
        if let Some(tap) = &core.tap {
            for update in tap.on_update(peer, update) {
                core.apply_update(peer, dict, update);
            }
            return;
        }
        core.apply_update(peer, dict, update);
    };
    loop {
        match read_frame(recv).await {
            Ok(Read::Frame(Frame::Update(update), bytes)) => {
                core.telemetry.frame_received(bytes);
                heard.note(&update);
                merge(&mut dict, update);
            }
            Ok(Read::Frame(Frame::Packed(packed), bytes)) => {
                core.telemetry.frame_received(bytes);
                match heard.unpack(packed) {
                    Ok(update) => {
                        core.telemetry.packed_frame_received();
                        merge(&mut dict, update);
                    }
                    Err(e) => {
                        tracing::debug!(peer = %peer, error = %e, "packed mesh frame dropped");
                        core.telemetry.dropped("bad_packed");
                    }
                }
            }
            Ok(Read::Frame(Frame::Speaks(speaks), bytes)) => {
                core.telemetry.frame_received(bytes);
                if core.speaks_packed && speaks.has(Speaks::PACKED_SLOTS) {
                    peer_packs.store(true, Ordering::Release);
                }
            }
            Ok(Read::Frame(Frame::Bye, bytes)) => {
                core.telemetry.frame_received(bytes);
                let mut tables = core.tables();
                tables.left.insert(peer.clone());
                core.refresh_membership(&mut tables);
                drop(tables);
                tracing::info!(peer = %peer, "mesh peer left");
                return;
            }
            Ok(Read::Frame(Frame::Workers(frame), bytes)) => {
                core.telemetry.frame_received(bytes);
                core.merge_workers(peer, &frame.entries);
            }
            Ok(Read::Frame(Frame::WorkersDigest(digest), bytes)) => {
                core.telemetry.frame_received(bytes);
                repairs.answer(core, &digest);
            }
            Ok(Read::Frame(Frame::Sightings(frame), bytes)) => {
                core.telemetry.frame_received(bytes);
                if frame.keys.len() > MAX_SIGHTINGS_PER_FRAME {
                    core.telemetry.dropped("oversize_sightings");
                    continue;
                }
                core.telemetry.sightings_received(frame.keys.len());
                core.sightings.deliver(&frame.keys);
            }
            Ok(Read::Frame(Frame::Objects(mut frame), bytes)) => {
                core.telemetry.frame_received(bytes);
                if frame.entries.len() > MAX_OBJECTS_PER_FRAME {
                    core.telemetry.dropped("oversize_objects");
                    continue;
                }
                let before = frame.entries.len();
                frame.entries.retain(crate::objects::is_acceptable);
                for _ in frame.entries.len()..before {
                    core.telemetry.dropped("bad_object");
                }
                core.telemetry.objects_received(frame.entries.len());
                core.objects.deliver(&frame.entries);
            }
            Ok(Read::Frame(Frame::Tenants(frame), bytes)) => {
                core.telemetry.frame_received(bytes);
                if frame.entries.len() > MAX_TENANTS_PER_FRAME {
                    core.telemetry.dropped("oversize_tenants");
                    continue;
                }
                let now_sec = crate::identity::unix_secs();
                for drop in core.tenants.deliver(peer, frame, now_sec) {
                    core.telemetry.dropped(drop.reason());
                }
            }
            Ok(Read::Frame(Frame::Hello(_), _)) => core.telemetry.dropped("unexpected_hello"),
            Ok(Read::Bad(e)) => {
                tracing::debug!(peer = %peer, error = %e, "mesh frame dropped");
                core.telemetry.dropped(e.reason());
            }
            Ok(Read::End) => return,
            Err(StreamError::TooLarge(_)) => {
                refuse(core, conn, "oversize");
                return;
            }
            Err(_) => return,
        }
    }
}
