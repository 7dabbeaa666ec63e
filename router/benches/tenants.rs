//! What tenant admission costs a request at 1,000 tenants: finding the
//! tenant by its key (a SHA-256 and a map lookup), and admitting it
//! against its fleet-wide window (the book's lock, summing this replica's
//! and three peers' last 60 seconds, the limit checks, booking, the
//! rate-limit headers, and the ticket's release), every tenant with a
//! full window of usage from every replica. The goal is ≤ 2 µs per
//! request. Also: the same with the admission gate granting a free slot
//! (fleet fair share booking the grant), and one freed slot's choice among
//! 1,000 waiting tenants. Run with `cargo bench -p shoal --bench tenants`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use divan::{Bencher, black_box};
use futures_util::FutureExt;
use shoal::admission::fair_queue::FairQueue;
use shoal::admission::{Admission, Ask, Priority};
use shoal::tenants::file::parse;
use shoal::tenants::share::FleetShare;
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

/// The whole admission of a tenant's request while slots are free: key,
/// limits, then `--max-concurrent-requests`' gate granting a slot at once
/// (with fleet fair share on, the grant is booked in the tenant's running
/// scope), and every release.
#[divan::bench]
fn key_admit_and_take_a_free_slot(bencher: Bencher) {
    let gate = gate();
    let slots = Admission::new(1_000_000, 1_000, [Duration::from_secs(60); 3]);
    let keys: Vec<String> = (0..TENANTS).map(key).collect();
    let next = AtomicUsize::new(0);
    bencher.bench_local(|| {
        let i = next.fetch_add(7, Ordering::Relaxed) % TENANTS;
        let tenant = gate.tenant_of(keys[i].as_bytes()).unwrap();
        let decision = gate.admit(&tenant, None, 1_000, Some(200));
        let ask = Ask {
            priority: Priority::Standard,
            flow: tenant.name.clone(),
            weight: tenant.weight,
            cost: 1_200,
            share: Some(tenant.share.clone() as Arc<dyn FleetShare>),
        };
        let permit = slots.admit(&ask).now_or_never();
        black_box((decision, permit))
    });
}

/// One freed slot's decision with a waiter of each of 1,000 tenants
/// queued (every tenant's fleet-wide grants read once): the cost of a
/// release under contention, paid once per request that waited.
#[divan::bench]
fn choose_among_1000_waiting_tenants(bencher: Bencher) {
    let gate = gate();
    let tenants: Vec<_> = (0..TENANTS)
        .map(|i| gate.tenant_of(key(i).as_bytes()).unwrap())
        .collect();
    let asks: Vec<Ask> = tenants
        .iter()
        .map(|t| {
            // Some grants in every tenant's recent seconds.
            drop(t.share.start(1_000));
            Ask {
                priority: Priority::Standard,
                flow: t.name.clone(),
                weight: t.weight,
                cost: 1_200,
                share: Some(t.share.clone() as Arc<dyn FleetShare>),
            }
        })
        .collect();
    let mut queue = FairQueue::default();
    for (i, ask) in asks.iter().enumerate() {
        queue.push(ask, i);
    }
    bencher.bench_local(|| {
        // The served tenant's next request takes its place at the back.
        let i = queue.pop().unwrap();
        queue.push(&asks[i], i);
        black_box(i)
    });
}
