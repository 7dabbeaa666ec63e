use std::collections::HashSet;
use std::sync::Arc;

use shoal_proto::frames::{Frame, TenantSecond, decode};

use super::*;
use crate::bell::ChangeBell;

const NOW: u64 = 1_800_000_000;

fn usage(requests: u64, output_tokens: u64) -> Usage {
    Usage {
        requests,
        input_tokens: 0,
        output_tokens,
    }
}

fn admit(book: &TenantBook, tenant: &Arc<str>, sec: u64, limit: u64) -> bool {
    book.admit(tenant, sec, usage(1, 0), |w| {
        if w.used.requests < limit {
            Ok(())
        } else {
            Err(())
        }
    })
    .is_ok()
}

fn frames_of(bytes: Vec<Vec<u8>>) -> Vec<TenantsFrame> {
    bytes
        .iter()
        .map(|f| match decode(&f[4..]).unwrap() {
            Frame::Tenants(frame) => frame,
            other => panic!("not a tenants frame: {other:?}"),
        })
        .collect()
}

fn peer(name: &str) -> Incarnation {
    Incarnation::new(name, 1)
}

fn counted(names: &[&str]) -> HashSet<Incarnation> {
    names.iter().map(|n| peer(n)).collect()
}

#[test]
fn admission_checks_the_window_before_the_request_and_books_it() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    let acme: Arc<str> = Arc::from("acme");
    let admitted = (0..5).filter(|_| admit(&book, &acme, NOW, 3)).count();
    assert_eq!(admitted, 3);
    let window = book.window("acme", NOW);
    assert_eq!(window.total().requests, 3);
    assert_eq!(window.in_flight, 3);
    assert_eq!(window.seconds.len(), 10);
    assert_eq!(window.first_sec, NOW - 9);
    book.finish(&acme);
    assert_eq!(book.window("acme", NOW).in_flight, 2);
}

#[test]
fn usage_leaves_the_window_when_its_second_passes() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    let acme: Arc<str> = Arc::from("acme");
    assert!(admit(&book, &acme, NOW, 1));
    assert!(!admit(&book, &acme, NOW + 9, 1), "still in the 10 s window");
    assert!(admit(&book, &acme, NOW + 10, 1), "gone after 10 s");
}

#[test]
fn a_peers_usage_counts_only_while_the_peer_counts() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    let frame = TenantsFrame {
        sent_unix_sec: NOW,
        entries: vec![TenantEntry {
            tenant: "acme".into(),
            in_flight: 2,
            seconds: vec![TenantSecond {
                unix_sec: NOW - 1,
                requests: 4,
                input_tokens: 10,
                output_tokens: 20,
            }],
        }],
    };
    assert!(book.deliver(&peer("b"), frame.clone(), NOW).is_empty());
    assert_eq!(book.window("acme", NOW).total().requests, 0);
    book.set_counted(&counted(&["b"]), NOW);
    assert!(book.deliver(&peer("b"), frame, NOW).is_empty());
    let window = book.window("acme", NOW);
    assert_eq!(
        window.total(),
        Usage {
            requests: 4,
            input_tokens: 10,
            output_tokens: 20
        }
    );
    assert_eq!(window.in_flight, 2);
    book.set_counted(&counted(&[]), NOW);
    assert_eq!(book.window("acme", NOW).total().requests, 0);
    book.set_counted(&counted(&["b"]), NOW);
    assert_eq!(
        book.window("acme", NOW).total().requests,
        0,
        "forgotten, not merely hidden: a returning peer resends its copy"
    );
}

#[test]
fn peer_values_are_absolute_so_a_repeat_or_a_newer_value_never_adds_up() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    book.set_counted(&counted(&["b"]), NOW);
    let at = |requests| TenantsFrame {
        sent_unix_sec: NOW,
        entries: vec![TenantEntry {
            tenant: "acme".into(),
            in_flight: 0,
            seconds: vec![TenantSecond {
                unix_sec: NOW,
                requests,
                input_tokens: 0,
                output_tokens: 0,
            }],
        }],
    };
    book.deliver(&peer("b"), at(3), NOW);
    book.deliver(&peer("b"), at(3), NOW);
    assert_eq!(book.window("acme", NOW).total().requests, 3);
    book.deliver(&peer("b"), at(5), NOW);
    assert_eq!(book.window("acme", NOW).total().requests, 5);
}

#[test]
fn own_changes_leave_once_and_a_new_link_gets_every_live_second() {
    let bell = Arc::new(ChangeBell::default());
    let book = TenantBook::meshed(&bell);
    book.set_window(10, NOW);
    let acme: Arc<str> = Arc::from("acme");
    assert!(admit(&book, &acme, NOW - 2, 100));
    assert!(admit(&book, &acme, NOW, 100));
    assert!(admit(&book, &acme, NOW, 100));
    let sent = frames_of(book.frames(NOW).unwrap());
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].entries[0].seconds.len(), 2, "one entry per second");
    assert_eq!(sent[0].entries[0].seconds[1].requests, 2);
    assert_eq!(sent[0].entries[0].in_flight, 3);
    assert!(book.frames(NOW).unwrap().is_empty(), "sent once");
    book.finish(&acme);
    let sent = frames_of(book.frames(NOW).unwrap());
    assert_eq!(sent[0].entries[0].in_flight, 2);
    assert!(
        sent[0].entries[0].seconds.is_empty(),
        "only in flight moved"
    );
    let full = frames_of(book.full_frames(NOW).unwrap());
    assert_eq!(full[0].entries[0].seconds.len(), 2);

    // A receiver fed the full copy sees what this node sees.
    let other = TenantBook::local();
    other.set_window(10, NOW);
    other.set_counted(&counted(&["a"]), NOW);
    other.deliver(&peer("a"), full[0].clone(), NOW);
    assert_eq!(other.window("acme", NOW), book.window("acme", NOW));
}

#[test]
fn bad_entries_are_dropped_and_named_and_the_rest_applies() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    book.set_counted(&counted(&["b"]), NOW);
    let second = |unix_sec| TenantSecond {
        unix_sec,
        requests: 1,
        input_tokens: 0,
        output_tokens: 0,
    };
    let frame = TenantsFrame {
        sent_unix_sec: NOW,
        entries: vec![
            TenantEntry {
                tenant: String::new(),
                in_flight: 1,
                seconds: vec![],
            },
            TenantEntry {
                tenant: "x".repeat(MAX_TENANT_NAME_BYTES + 1),
                in_flight: 1,
                seconds: vec![],
            },
            TenantEntry {
                tenant: "many".into(),
                in_flight: 1,
                seconds: vec![second(NOW); MAX_TENANT_SECONDS + 1],
            },
            TenantEntry {
                tenant: "acme".into(),
                in_flight: 0,
                seconds: vec![second(NOW - 1000), second(NOW + 1000), second(NOW)],
            },
        ],
    };
    let dropped = book.deliver(&peer("b"), frame, NOW);
    assert_eq!(
        dropped,
        [
            TenantDrop::Name,
            TenantDrop::Name,
            TenantDrop::Seconds,
            TenantDrop::Clock,
            TenantDrop::Clock
        ]
    );
    assert_eq!(book.window("acme", NOW).total().requests, 1);
    assert_eq!(book.tenants(), vec![Arc::<str>::from("acme")]);
}

#[test]
fn a_peers_second_ahead_of_this_clock_counts_now() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    book.set_counted(&counted(&["b"]), NOW);
    let frame = TenantsFrame {
        sent_unix_sec: NOW,
        entries: vec![TenantEntry {
            tenant: "acme".into(),
            in_flight: 0,
            seconds: vec![TenantSecond {
                unix_sec: NOW + 2,
                requests: 7,
                input_tokens: 0,
                output_tokens: 0,
            }],
        }],
    };
    book.deliver(&peer("b"), frame, NOW);
    let window = book.window("acme", NOW);
    assert_eq!(window.seconds.last().map(|u| u.requests), Some(7));
}

#[test]
fn a_replica_without_a_mesh_keeps_no_changes_to_send() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    let acme: Arc<str> = Arc::from("acme");
    for _ in 0..1000 {
        assert!(admit(&book, &acme, NOW, u64::MAX));
        book.finish(&acme);
    }
    assert!(book.lock().dirty.is_empty());
}

#[test]
fn settling_replaces_the_estimate_with_what_was_used_and_goes_out() {
    let bell = Arc::new(ChangeBell::default());
    let book = TenantBook::meshed(&bell);
    book.set_window(10, NOW);
    let acme: Arc<str> = Arc::from("acme");
    let booked = Usage {
        requests: 1,
        input_tokens: 100,
        output_tokens: 500,
    };
    for _ in 0..2 {
        book.admit(&acme, NOW - 1, booked, |_| Ok::<(), ()>(()))
            .unwrap();
    }
    book.frames(NOW).unwrap();
    let used = Usage {
        requests: 1,
        input_tokens: 120,
        output_tokens: 30,
    };
    book.settle(&acme, NOW - 1, booked, used);
    assert_eq!(
        book.window("acme", NOW).total(),
        Usage {
            requests: 2,
            input_tokens: 220,
            output_tokens: 530,
        }
    );
    let sent = frames_of(book.frames(NOW).unwrap());
    assert_eq!(sent[0].entries[0].seconds[0].output_tokens, 530);
    // A second no longer held, or a tenant never seen, changes nothing.
    book.settle(&acme, NOW - 5, booked, used);
    book.settle(&Arc::from("bob"), NOW - 1, booked, used);
    assert_eq!(book.window("acme", NOW).total().output_tokens, 530);
}

/// The running sums always equal the sum of the series they stand for,
/// through own admissions, settlements, peers' absolute values (repeats,
/// seconds ahead and behind), peers counted and uncounted, window changes
/// and time passing.
#[test]
fn running_sums_equal_the_series_whatever_happens() {
    let bell = Arc::new(ChangeBell::default());
    let book = TenantBook::meshed(&bell);
    let tenants: [Arc<str>; 3] = [Arc::from("a"), Arc::from("b"), Arc::from("c")];
    let peers = ["p", "q", "r"];
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut now = NOW;
    let mut counted_now: Vec<&str> = Vec::new();
    // Each peer's clock is off by its own amount, and steps now and then.
    let mut skews: [i64; 3] = [0, 7, -13];
    book.set_window(10, now);
    for step in 0..5_000 {
        let tenant = &tenants[next(3) as usize];
        match next(9) {
            0 if next(20) == 0 => now += 60 + next(100),
            0 => now += next(4),
            1 => book.set_window(1 + next(60), now),
            2 => {
                let used = usage(1, next(50));
                book.admit(tenant, now, used, |_| Ok::<(), ()>(())).unwrap();
                if next(2) == 0 {
                    book.finish(tenant);
                }
            }
            3 if next(10) == 0 => skews[next(3) as usize] += next(9) as i64 - 4,
            3 => book.settle(tenant, now - next(3), usage(1, 10), usage(1, next(30))),
            4 => {
                let peer = peers[next(3) as usize];
                if counted_now.contains(&peer) {
                    counted_now.retain(|p| *p != peer);
                } else {
                    counted_now.push(peer);
                }
                book.set_counted(&counted(&counted_now), now);
            }
            _ => {
                let p = next(3) as usize;
                let their_now = shift(now, skews[p]);
                let sec = their_now + next(40) - next(100).min(their_now);
                let frame = TenantsFrame {
                    sent_unix_sec: their_now,
                    entries: vec![TenantEntry {
                        tenant: tenant.to_string(),
                        in_flight: next(5),
                        seconds: vec![TenantSecond {
                            unix_sec: sec,
                            requests: next(7),
                            input_tokens: next(100),
                            output_tokens: next(100),
                        }],
                    }],
                };
                book.deliver(&peer(peers[p]), frame, now);
            }
        }
        for tenant in &tenants {
            let got = book.window(tenant, now);
            let (want, want_in_flight) = brute_force(&book, tenant, now);
            assert_eq!(got.total(), want, "step {step}, tenant {tenant}");
            assert_eq!(
                got.in_flight, want_in_flight,
                "step {step}, tenant {tenant}"
            );
        }
    }
}

/// What `tenant`'s window at `now` holds, summed from the series.
fn brute_force(book: &TenantBook, tenant: &str, now: u64) -> (Usage, u64) {
    let inner = book.lock();
    let window = inner.window_secs;
    let counted_peers = inner
        .peers
        .iter()
        .filter(|(inc, _)| inner.counted.contains(*inc))
        .filter_map(|(_, tenants)| tenants.get(tenant));
    let mut total = Usage::default();
    let mut in_flight = 0;
    for series in inner.own.get(tenant).into_iter().chain(counted_peers) {
        in_flight += series.in_flight;
        for (sec, u) in &series.seconds {
            if sec + window > now && *sec <= now + aggregate::AHEAD_SECS {
                total.add_saturating(*u);
            }
        }
    }
    (total, in_flight)
}

#[test]
fn a_peer_whose_clock_is_off_is_counted_on_this_clock() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    book.set_counted(&counted(&["b"]), NOW);
    // b's clock is 25 s behind: its "now" is NOW - 25, outside this
    // node's 10 s window unless mapped.
    let frame = |requests| TenantsFrame {
        sent_unix_sec: NOW - 25,
        entries: vec![TenantEntry {
            tenant: "acme".into(),
            in_flight: 0,
            seconds: vec![TenantSecond {
                unix_sec: NOW - 25,
                requests,
                input_tokens: 0,
                output_tokens: 0,
            }],
        }],
    };
    assert!(book.deliver(&peer("b"), frame(3), NOW).is_empty());
    assert_eq!(book.window("acme", NOW).total().requests, 3);
    assert_eq!(book.window("acme", NOW + 9).total().requests, 3);
    assert_eq!(
        book.window("acme", NOW + 10).total().requests,
        0,
        "it leaves when a window has passed on this clock"
    );
}

#[test]
fn a_peers_tenants_this_node_does_not_know_are_dropped() {
    let book = TenantBook::local();
    book.set_window(10, NOW);
    book.set_known([Arc::<str>::from("acme")]);
    book.set_counted(&counted(&["b"]), NOW);
    let frame = TenantsFrame {
        sent_unix_sec: NOW,
        entries: ["acme", "stranger"]
            .iter()
            .map(|t| TenantEntry {
                tenant: t.to_string(),
                in_flight: 1,
                seconds: vec![],
            })
            .collect(),
    };
    assert_eq!(book.deliver(&peer("b"), frame, NOW), [TenantDrop::Unknown]);
    assert_eq!(book.tenants(), vec![Arc::<str>::from("acme")]);
}
