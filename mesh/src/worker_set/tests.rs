use super::*;
use std::sync::Arc;
use tokio::sync::watch;

fn entry(url: &str, hlc_us: u64, origin: &str, present: bool) -> WorkerSetEntry {
    WorkerSetEntry {
        url: url.into(),
        hlc_us,
        origin: origin.into(),
        present,
    }
}

const NOW: u64 = 1_700_000_000_000_000;

#[test]
fn the_later_write_wins_and_merges_commute() {
    let writes = [
        entry("http://w:1", NOW, "a", true),
        entry("http://w:1", NOW + 5, "b", false),
        entry("http://w:1", NOW + 5, "a", true),
        entry("http://w:2", NOW + 1, "c", true),
    ];
    let mut states = Vec::new();
    let mut digests = Vec::new();
    for order in [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 2, 0, 1]] {
        let mut set = WorkerSet::new("x");
        for i in order {
            set.merge(&writes[i], NOW).unwrap();
        }
        // Duplicates change nothing.
        for w in &writes {
            set.merge(w, NOW).unwrap();
        }
        states.push(set.to_entries());
        digests.push(set.digest());
    }
    assert!(states.windows(2).all(|w| w[0] == w[1]), "{states:?}");
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "same set, same digest"
    );
    let w1 = &states[0][0];
    assert_eq!(
        (w1.present, w1.origin.as_str()),
        (false, "b"),
        "tie on the clock: larger origin"
    );
}

#[test]
fn a_removal_after_seeing_an_add_wins_even_with_a_slow_clock() {
    let mut a = WorkerSet::new("a");
    // A peer with a clock ahead (within the bound) added the worker.
    let ahead = NOW + MAX_FUTURE.as_micros() as u64;
    a.merge(&entry("http://w:1", ahead, "z", true), NOW)
        .unwrap();
    let stamp = a.write("http://w:1", false, NOW).unwrap();
    assert!(stamp.hlc_us > ahead, "raised past what it saw");
    assert!(!a.get("http://w:1").unwrap().present);
}

#[test]
fn hostile_entries_are_refused_and_the_set_is_bounded() {
    let mut set = WorkerSet::new("a");
    assert_eq!(MAX_FUTURE, Duration::from_millis(MAX_CLOCK_SKEW_MS));
    let far = NOW + MAX_FUTURE.as_micros() as u64 + 1;
    assert_eq!(
        set.merge(&entry("http://w:1", far, "b", true), NOW),
        Err(Refused::Future)
    );
    assert_eq!(
        set.merge(&entry("", NOW, "b", true), NOW),
        Err(Refused::BadUrl)
    );
    let long = "x".repeat(MAX_KEY_BYTES + 1);
    assert_eq!(
        set.merge(&entry(&long, NOW, "b", true), NOW),
        Err(Refused::BadUrl)
    );
    assert_eq!(
        set.merge(&entry("u", NOW, "bad name!", true), NOW),
        Err(Refused::BadOrigin)
    );
    for i in 0..MAX_ENTRIES {
        set.write(&format!("http://w:{i}"), true, NOW).unwrap();
    }
    assert_eq!(
        set.merge(&entry("http://new:1", NOW, "b", true), NOW),
        Err(Refused::Full)
    );
    assert_eq!(set.write("http://new:1", true, NOW), Err(Refused::Full));
    assert!(
        set.write("http://w:0", false, NOW).is_ok(),
        "known URLs still change"
    );
}

#[test]
fn removals_are_forgotten_after_their_ttl_and_adds_are_kept() {
    let mut set = WorkerSet::new("a");
    let empty = set.digest();
    set.write("http://gone:1", false, NOW).unwrap();
    let with_kept = {
        let mut s = WorkerSet::new("a");
        s.merge(&entry("http://kept:1", NOW + 1, "a", true), NOW)
            .unwrap();
        s.digest()
    };
    set.write("http://kept:1", true, NOW).unwrap();
    let ttl = Duration::from_secs(60);
    assert_eq!(set.forget_removals(NOW + 59_000_000, ttl), 0);
    assert_eq!(set.forget_removals(NOW + 61_000_000, ttl), 1);
    assert!(set.get("http://gone:1").is_none());
    assert!(set.get("http://kept:1").is_some());
    assert_ne!(set.digest(), empty);
    assert_eq!(
        set.digest(),
        with_kept,
        "the forgotten entry left the digest"
    );
}

fn sender<'a>(name: &'a str, live: &'a dyn Fn(&str) -> bool) -> Sender<'a> {
    Sender {
        name,
        is_live_peer: live,
    }
}

/// A sender speaks for itself and relays for writers that are not live
/// peers; an entry in a live peer's name, or in this node's own name
/// stamped after it started, is forged. An entry that changes nothing is
/// not judged at all.
#[test]
fn origins_are_bound_to_the_sender() {
    let live = |name: &str| ["b", "c"].contains(&name);
    let from_b = sender("b", &live);
    let mut set = WorkerSet::new("a").started_at(NOW);
    let merge = |set: &mut WorkerSet, e: WorkerSetEntry| set.merge_from(&e, &from_b, NOW);
    assert_eq!(
        merge(&mut set, entry("http://own:1", NOW, "b", true)),
        Ok(true)
    );
    assert_eq!(
        merge(&mut set, entry("http://forged:1", NOW, "c", true)),
        Err(Refused::ForgedOrigin),
        "c is live: it speaks for itself"
    );
    assert_eq!(
        merge(&mut set, entry("http://relay:1", NOW, "gone", true)),
        Ok(true),
        "a writer that is not a live peer is relayed"
    );
    assert_eq!(
        merge(&mut set, entry("http://mine:1", NOW - 1, "a", true)),
        Ok(true),
        "this node's previous run's write, relayed back"
    );
    assert_eq!(
        merge(&mut set, entry("http://mine:2", NOW, "a", true)),
        Err(Refused::ForgedOrigin),
        "this run's writes are its own"
    );
    // The forged check runs before the clock check.
    assert_eq!(
        merge(
            &mut set,
            entry("http://forged:2", NOW + 60_000_000, "c", true)
        ),
        Err(Refused::ForgedOrigin)
    );
    // c's own entry, held already: b relaying it again is no change.
    set.merge_from(
        &entry("http://c:1", NOW, "c", true),
        &sender("c", &live),
        NOW,
    )
    .unwrap();
    assert_eq!(
        merge(&mut set, entry("http://c:1", NOW, "c", true)),
        Ok(false)
    );
    let w = set.write("http://w:1", true, NOW + 10).unwrap();
    assert_eq!(
        merge(&mut set, entry("http://w:1", w.hlc_us, "a", true)),
        Ok(false)
    );
}

/// Only this node's own writes are taken for the next round, once each,
/// as their current registers.
#[test]
fn own_writes_are_the_delta_and_merges_are_not() {
    let mut set = WorkerSet::new("a");
    set.write("http://a:1", true, NOW).unwrap();
    set.write("http://a:2", true, NOW).unwrap();
    set.merge(&entry("http://b:1", NOW, "b", true), NOW)
        .unwrap();
    // A peer's later write superseded one of ours: its register goes out.
    set.merge(&entry("http://a:2", NOW + 100, "b", false), NOW)
        .unwrap();
    let taken = set.take_own_changes();
    let urls: Vec<&str> = taken.iter().map(|e| e.url.as_str()).collect();
    assert_eq!(urls, ["http://a:1", "http://a:2"]);
    assert!(!taken[1].present);
    assert!(set.take_own_changes().is_empty(), "taken once");
    set.restore_own_changes(&taken[..1]);
    assert_eq!(set.take_own_changes().len(), 1, "given back");
}

/// A replica whose set is full refuses a peer's new entry; once it has
/// room, the digest shows the difference and the peer's repair carries
/// the entry again, which now lands. The same repair carries an entry
/// refused as `Future` once the receiver's clock allows.
#[test]
fn the_digest_repair_resends_what_was_refused() {
    let none = |_: &str| false;
    let mut a = WorkerSet::new("a");
    let mut b = WorkerSet::new("b");
    for i in 0..MAX_ENTRIES - 2 {
        b.write(&format!("http://b:{i}"), true, NOW).unwrap();
    }
    b.write("http://gone:1", false, NOW).unwrap();
    b.write("http://gone:2", false, NOW).unwrap();
    let e = a.write("http://a:1", true, NOW).unwrap();
    let sent = entry("http://a:1", e.hlc_us, "a", true);
    assert_eq!(
        b.merge_from(&sent, &sender("a", &none), NOW),
        Err(Refused::Full)
    );
    let ahead = a.write("http://a:2", true, NOW + 5_000_000).unwrap();
    b.forget_removals(NOW + 2_000_000, Duration::from_secs(1));
    let repair = a.repair_for(&b.digest()).unwrap();
    assert!(repair.iter().any(|r| r.url == "http://a:1"));
    for r in &repair {
        let _ = b.merge_from(r, &sender("a", &none), NOW + 2_000_000);
    }
    assert!(b.get("http://a:1").is_some(), "full no longer");
    assert!(b.get("http://a:2").is_none(), "still ahead of b's clock");
    let later = NOW + 5_000_000;
    for r in &a.repair_for(&b.digest()).unwrap() {
        let _ = b.merge_from(r, &sender("a", &none), later);
    }
    assert_eq!(b.get("http://a:2").unwrap().stamp, ahead);
    assert!(a.repair_for(&[0; 3]).is_none(), "another shape");
}

#[test]
fn the_shared_set_rings_the_bell_on_own_writes_and_bumps_its_version_on_change() {
    let bell = Arc::new(watch::Sender::new(0u64));
    let clock: WallClock = Arc::new(|| NOW);
    let shared = SharedWorkerSet::meshed(
        WorkerSet::new("a"),
        Duration::from_secs(1),
        bell.clone(),
        clock,
    );
    let mut rx = shared.subscribe();
    shared.write("http://w:1", true).unwrap();
    assert!(rx.has_changed().unwrap());
    rx.mark_unchanged();
    assert_eq!(*bell.borrow(), 1);
    let held = shared.lock().to_entries();
    assert!(shared.merge(&held).is_empty());
    assert!(
        !rx.has_changed().unwrap(),
        "an entry already held is no change"
    );
    assert!(
        shared
            .merge(&[entry("http://w:2", NOW, "b", true)])
            .is_empty()
    );
    assert!(rx.has_changed().unwrap(), "a peer's entry is a change");
    assert_eq!(*bell.borrow(), 1, "but is not sent on");
    // A removal older than the TTL is not merged back.
    assert!(
        shared
            .merge(&[entry("http://w:3", NOW - 2_000_000, "b", false)])
            .is_empty()
    );
    assert!(shared.lock().get("http://w:3").is_none());
}
