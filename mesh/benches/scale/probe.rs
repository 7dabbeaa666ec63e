//! Visibility probes across processes. Every replica advances a sequence
//! number on its own probe key (held as the in-flight tokens of one
//! booking) every 50..150 ms; observer replicas poll every probe key each
//! millisecond and note when each number first shows. Both sides stamp the
//! wall clock — one machine, one clock — so the parent matches the two
//! into lags: booking at A until B's fleet view shows it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shoal_mesh::{Mesh, SlotBooking, WorkerSlot};

use crate::load::Rng;
use crate::usage::{thread_cpu, unix_us};

/// The probe key of replica `i`.
pub fn key(i: usize) -> String {
    format!("http://probe-{i}:1")
}

/// The key the victim holds a booking on when it is killed.
pub const KILL_KEY: &str = "http://kill:1";

/// Advances this replica's probe until `stop`; returns (seq, sent at µs).
pub fn send(slot: &WorkerSlot, stop: &AtomicBool, cpu_us: &AtomicU64) -> Vec<(u64, u64)> {
    let mut rng = Rng(0x9e37 ^ unix_us());
    let mut sent = Vec::new();
    let mut held: Option<SlotBooking> = None;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.range(50, 150)));
        seq += 1;
        sent.push((seq, unix_us()));
        // Book the next before releasing the last: an observer reading one
        // request in flight reads a whole sequence number.
        let next = slot.book(0, seq);
        drop(held.replace(next));
        cpu_us.store(thread_cpu().as_micros() as u64, Ordering::Relaxed);
    }
    sent
}

/// What one observer saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Seen {
    /// (sender, seq, first seen at µs).
    pub probes: Vec<(u32, u64, u64)>,
    /// When the victim's booking left this view, µs.
    pub kill_load_gone_us: Option<u64>,
    /// When the victim left this node's member list, µs.
    pub kill_member_gone_us: Option<u64>,
}

/// Polls every other replica's probe key, the kill key and the member
/// count each millisecond until `stop`; prints `GONE` once the victim's
/// load and membership are both gone.
pub fn watch(
    mesh: &Mesh,
    me: usize,
    probes: &[WorkerSlot],
    kill: &WorkerSlot,
    stop: &AtomicBool,
    cpu_us: &AtomicU64,
) -> Seen {
    let replicas = probes.len();
    let mut seen = Seen::default();
    let mut last = vec![0u64; replicas];
    let mut kill_seen_held = false;
    let mut said_gone = false;
    let mut tick = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = unix_us();
        for (s, slot) in probes.iter().enumerate() {
            if s == me {
                continue;
            }
            let counts = slot.fleet().counts;
            if counts.requests == 1 && counts.tokens > last[s] {
                last[s] = counts.tokens;
                seen.probes.push((s as u32, counts.tokens, now));
            }
        }
        let held = kill.fleet().counts.requests;
        if held > 0 {
            kill_seen_held = true;
        } else if kill_seen_held && seen.kill_load_gone_us.is_none() {
            seen.kill_load_gone_us = Some(now);
        }
        tick += 1;
        if tick.is_multiple_of(5)
            && seen.kill_member_gone_us.is_none()
            && kill_seen_held
            && mesh.members().len() < replicas
        {
            seen.kill_member_gone_us = Some(now);
        }
        if tick.is_multiple_of(100) {
            cpu_us.store(thread_cpu().as_micros() as u64, Ordering::Relaxed);
        }
        if !said_gone && seen.kill_load_gone_us.is_some() && seen.kill_member_gone_us.is_some() {
            // The parent stops waiting once every observer said it.
            said_gone = true;
            crate::node::say("GONE");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cpu_us.store(thread_cpu().as_micros() as u64, Ordering::Relaxed);
    seen
}
