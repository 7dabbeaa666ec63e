//! The source rule: seeds and discovery route a URL unless an admin removed
//! it; an admin add routes it; a peer's writes arrive through the set.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use shoal_mesh::SharedWorkerSet;
use shoal_mesh::proto::frames::WorkerSetEntry;

use super::*;
use crate::config::BreakerConfig;
use crate::policy::RoundRobinPolicy;

fn sources(seeds: &[&str], ttl: Duration) -> WorkerSources {
    let seeds: Vec<String> = seeds.iter().map(|s| s.to_string()).collect();
    let registry = Arc::new(Registry::new(&seeds, BreakerConfig::default()));
    let set = SharedWorkerSet::local("a", ttl);
    WorkerSources::new(registry, Arc::new(RoundRobinPolicy::default()), set, &seeds)
}

fn routed(s: &WorkerSources) -> Vec<String> {
    s.registry
        .all()
        .iter()
        .map(|w| w.url().to_string())
        .collect()
}

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn admin_writes_decide_over_seeds_and_later_writes_win() {
    let s = sources(&["http://seed:1"], HOUR);
    assert_eq!(routed(&s), ["http://seed:1"]);
    assert_eq!(s.source_of("http://seed:1"), Some(Source::Seed));
    let added = s.add("http://new:1").unwrap();
    assert_eq!(added.url(), "http://new:1");
    assert_eq!(s.source_of("http://new:1"), Some(Source::Admin));
    assert_eq!(
        s.add("http://new:1").unwrap_err(),
        AdminError::Exists("http://new:1".into())
    );
    s.remove("http://seed:1").unwrap();
    assert_eq!(
        routed(&s),
        ["http://new:1"],
        "an admin removal overrides the seed"
    );
    assert_eq!(
        s.remove("http://seed:1").unwrap_err(),
        AdminError::NotFound("http://seed:1".into())
    );
    s.add("http://seed:1").unwrap();
    assert_eq!(
        s.source_of("http://seed:1"),
        Some(Source::Admin),
        "added again"
    );
    assert_eq!(routed(&s).len(), 2);
}

#[test]
fn an_admin_add_of_a_seeded_url_is_a_fleet_wide_write_like_its_removal() {
    let s = sources(&["http://seed:1"], HOUR);
    let added = s.add("http://seed:1").unwrap();
    assert_eq!(added.url(), "http://seed:1");
    assert_eq!(
        s.source_of("http://seed:1"),
        Some(Source::Admin),
        "now added for every replica, not only the one seeding it"
    );
    assert!(s.worker_set().lock().get("http://seed:1").unwrap().present);
    assert_eq!(
        s.add("http://seed:1").unwrap_err(),
        AdminError::Exists("http://seed:1".into())
    );
    assert_eq!(routed(&s), ["http://seed:1"], "still one worker");
}

#[test]
fn discovery_adds_and_removes_and_an_admin_removal_overrides_it() {
    let s = sources(&[], HOUR);
    let found: BTreeSet<String> = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
        .map(String::from)
        .into();
    let done = s.set_discovered(found.clone());
    assert_eq!(done.added.len(), 2);
    assert_eq!(s.source_of("http://10.0.0.1:8000"), Some(Source::Discovery));
    s.remove("http://10.0.0.2:8000").unwrap();
    assert_eq!(routed(&s), ["http://10.0.0.1:8000"]);
    let done = s.set_discovered(found);
    assert!(
        done.added.is_empty(),
        "still removed by the admin: {done:?}"
    );
    let done = s.set_discovered(BTreeSet::new());
    assert_eq!(done.removed, ["http://10.0.0.1:8000"]);
    assert!(routed(&s).is_empty());
}

#[test]
fn a_peers_writes_are_applied_and_foreign_url_forms_ignored() {
    let s = sources(&["http://seed:1"], HOUR);
    let peer = |url: &str, present: bool| WorkerSetEntry {
        url: url.into(),
        hlc_us: shoal_mesh::identity::unix_micros(),
        origin: "b".into(),
        present,
    };
    let refused = s.worker_set().merge(&[
        peer("http://peer-added:1", true),
        peer("http://seed:1", false),
        peer("http://not-normal:1/", true),
        peer("ftp://nope", true),
    ]);
    assert!(refused.is_empty());
    s.reconcile();
    assert_eq!(routed(&s), ["http://peer-added:1"]);
}

#[test]
fn a_removal_expires_and_the_seed_comes_back() {
    let s = sources(&["http://seed:1"], Duration::from_millis(1));
    s.remove("http://seed:1").unwrap();
    assert!(routed(&s).is_empty());
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(s.worker_set().forget_removals(), 1);
    s.reconcile();
    assert_eq!(routed(&s), ["http://seed:1"]);
}
