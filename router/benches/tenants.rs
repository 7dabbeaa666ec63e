//! What tenant admission costs a request at 1,000 tenants: finding the
//! tenant by its key (a SHA-256 and a map lookup), and admitting it
//! against its fleet-wide window (the book's lock, summing this replica's
//! and three peers' last 60 seconds, the limit checks, booking, the
//! rate-limit headers, and the ticket's release), every tenant with a
//! full window of usage from every replica. The goal is ≤ 2 µs
//! per request. Run with `cargo bench -p shoal --bench tenants`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use divan::{Bencher, black_box};
use shoal::tenants::file::parse;
use shoal::tenants::{Decision, TenantGate};
use shoal_mesh::TenantBook;
use shoal_mesh::identity::{Incarnation, unix_micros};
use shoal_proto::frames::{MAX_TENANTS_PER_FRAME, TenantEntry, TenantSecond, TenantsFrame};

const TENANTS: usize = 1_000;
const PEERS: usize = 3;
const WINDOW: u64 = 60;

fn main() {
    divan::main();
}

fn key(i: usize) -> String {
    format!("tenant-key-{i:06}")
}

fn gate() -> TenantGate {
    let mut text = format!("window_secs = {WINDOW}\n");
    for i in 0..TENANTS {
        text.push_str(&format!(
            "[tenants.t{i}]\nkeys = [\"{}\"]\nrequests_per_minute = 1000000000\n\
             tokens_per_minute = 1000000000000\noutput_tokens_per_minute = 1000000000000\n\
             max_concurrent = 1000000\n",
            key(i)
        ));
    }
    let spec = parse(&text).unwrap();
    let book = Arc::new(TenantBook::local());
    let now = unix_micros() / 1_000_000;
    for p in 0..PEERS {
        let peer = Incarnation::new(format!("peer-{p}"), 1);
        let entries: Vec<TenantEntry> = (0..TENANTS)
            .map(|i| TenantEntry {
                tenant: format!("t{i}"),
                in_flight: 3,
                seconds: (0..WINDOW)
                    .map(|s| TenantSecond {
                        unix_sec: now - s,
                        requests: 5,
                        input_tokens: 2_000,
                        output_tokens: 500,
                    })
                    .collect(),
            })
            .collect();
        for chunk in entries.chunks(MAX_TENANTS_PER_FRAME) {
            let frame = TenantsFrame {
                sent_unix_sec: now,
                entries: chunk.to_vec(),
            };
            book.absorb_as_peer(&peer, frame, now);
        }
    }
    let gate = TenantGate::new(&spec, book);
    // Print what the window holds, so the figure is read with its load.
    let t0 = gate.tenant_of(key(0).as_bytes()).unwrap();
    match gate.admit(&t0, None, 1_000, Some(200)) {
        Decision::Admitted(_, headers) => eprintln!(
            "tenants bench: {TENANTS} tenants, {PEERS} peers + this replica, {WINDOW} s window; \
             {} rate-limit headers per answer",
            headers.len()
        ),
        Decision::Refused(breach, _) => panic!("refused: {}", breach.message),
    }
    gate
}

#[divan::bench]
fn find_tenant_by_key(bencher: Bencher) {
    let gate = gate();
    let keys: Vec<String> = (0..TENANTS).map(key).collect();
    let next = AtomicUsize::new(0);
    bencher.bench_local(|| {
        let i = next.fetch_add(7, Ordering::Relaxed) % TENANTS;
        black_box(gate.tenant_of(keys[i].as_bytes()))
    });
}

#[divan::bench]
fn admit_and_release(bencher: Bencher) {
    let gate = gate();
    let tenants: Vec<_> = (0..TENANTS)
        .map(|i| gate.tenant_of(key(i).as_bytes()).unwrap())
        .collect();
    let next = AtomicUsize::new(0);
    bencher.bench_local(|| {
        let i = next.fetch_add(7, Ordering::Relaxed) % TENANTS;
        // The ticket drops here: the request's release is part of the cost.
        black_box(gate.admit(&tenants[i], None, 1_000, Some(200)))
    });
}

#[divan::bench]
fn key_then_admit_and_release(bencher: Bencher) {
    let gate = gate();
    let keys: Vec<String> = (0..TENANTS).map(key).collect();
    let next = AtomicUsize::new(0);
    bencher.bench_local(|| {
        let i = next.fetch_add(7, Ordering::Relaxed) % TENANTS;
        let tenant = gate.tenant_of(keys[i].as_bytes()).unwrap();
        black_box(gate.admit(&tenant, None, 1_000, Some(200)))
    });
}
