use super::*;

/// Checks every structural invariant: parent links, sorted children keyed
/// by their edge's first byte, tenant nesting, and per-tenant sizes.
fn check(tree: &PrefixTree) {
    let mut sizes: IdMap<usize> = IdMap::default();
    for (slot, node) in tree.nodes.iter().enumerate() {
        if node.parent == FREE {
            assert!(tree.free.contains(&(slot as u32)));
            continue;
        }
        let keys: Vec<u8> = node.children.iter().map(|(b, _)| *b).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "children sorted");
        for (byte, child) in &node.children {
            let child = &tree.nodes[*child as usize];
            assert_eq!(child.parent, slot as u32);
            assert_eq!(child.edge.first(), Some(byte));
            for tenant in child.tenants.keys() {
                assert!(slot == 0 || node.tenants.contains_key(tenant), "nesting");
            }
        }
        if slot != 0 {
            assert!(!node.tenants.is_empty(), "no node without tenants");
        }
        for tenant in node.tenants.keys() {
            *sizes.entry(*tenant).or_default() += node.edge.len();
        }
    }
    assert_eq!(sizes, tree.sizes);
}

fn best(tree: &PrefixTree, text: &str, tenant: Tenant) -> usize {
    let mut path = Vec::new();
    tree.walk(text.as_bytes(), &mut path);
    path.iter()
        .rev()
        .find(|l| tree.tenants(l.node).contains_key(&tenant))
        .map_or(0, |l| l.matched)
}

#[test]
fn insert_splits_edges_and_matches_partially() {
    let mut tree = PrefixTree::default();
    tree.insert(b"hello world", 1);
    tree.insert(b"hello there", 2);
    check(&tree);
    assert_eq!(tree.size_of(1), 11);
    assert_eq!(tree.size_of(2), 11);
    assert_eq!(tree.node_count(), 4, "root, 'hello ', 'world', 'there'");
    assert_eq!(best(&tree, "hello world!", 1), 11);
    assert_eq!(best(&tree, "hello world!", 2), 6);
    assert_eq!(best(&tree, "hello wo", 1), 8, "part of an edge counts");
    assert_eq!(best(&tree, "help", 2), 3);
    assert_eq!(best(&tree, "xyz", 1), 0);
    tree.insert(b"hello world", 2);
    tree.insert(b"hello", 3);
    check(&tree);
    assert_eq!(tree.size_of(2), 16);
    assert_eq!(tree.size_of(3), 5);
    assert_eq!(best(&tree, "hello world", 2), 11);
}

#[test]
fn multibyte_text_is_matched_on_bytes() {
    let mut tree = PrefixTree::default();
    tree.insert("héllo".as_bytes(), 1);
    tree.insert("hèllo".as_bytes(), 2);
    check(&tree);
    assert_eq!(best(&tree, "héllo", 1), "héllo".len());
    assert_eq!(best(&tree, "héllo", 2), 2, "'h' and the shared lead byte");
}

#[test]
fn eviction_drops_least_recently_used_leaves_down_to_the_bound() {
    let mut tree = PrefixTree::default();
    tree.insert(b"system: be brief. user: old question", 1);
    tree.insert(b"system: be brief. user: new question", 1);
    tree.insert(b"system: be brief. user: other", 2);
    let before = tree.size_of(1);
    assert_eq!(before, 24 + 12 + 12);
    let evicted = tree.evict(36);
    check(&tree);
    assert_eq!(evicted, 12);
    assert_eq!(tree.size_of(1), 36);
    assert_eq!(best(&tree, "system: be brief. user: new question", 1), 36);
    assert_eq!(best(&tree, "system: be brief. user: old question", 1), 24);
    assert_eq!(tree.size_of(2), 24 + 5, "the other tenant is untouched");

    // Down to nothing: its nodes go, the shared stem stays for tenant 2.
    tree.evict(0);
    check(&tree);
    assert_eq!(tree.size_of(1), 0);
    assert_eq!(tree.size_of(2), 0);
    assert_eq!(tree.node_count(), 1, "only the root");
}

#[test]
fn forgetting_a_tenant_frees_its_nodes_and_slots_are_reused() {
    let mut tree = PrefixTree::default();
    tree.insert(b"abc-one", 1);
    tree.insert(b"abc-two", 2);
    tree.insert(b"zzz", 1);
    assert_eq!(tree.forget(&[1]), 2, "'one' and 'zzz'");
    check(&tree);
    assert_eq!(tree.size_of(1), 0);
    assert_eq!(best(&tree, "abc-two", 2), 7);
    assert_eq!(tree.forget(&[1]), 0, "nothing left to forget");
    let nodes = tree.nodes.len();
    tree.insert(b"qqq", 3);
    tree.insert(b"abc-onf", 3);
    check(&tree);
    assert_eq!(tree.nodes.len(), nodes, "freed slots reused");
    assert_eq!(best(&tree, "abc-onf", 3), 7);
}

#[test]
fn random_workload_keeps_invariants() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut tree = PrefixTree::default();
    for round in 0..400 {
        let len = rng.random_range(1..40);
        let text: Vec<u8> = (0..len).map(|_| b"abc"[rng.random_range(0..3)]).collect();
        tree.insert(&text, rng.random_range(0..5));
        if round % 50 == 49 {
            tree.evict(60);
            check(&tree);
            assert!((0..5).all(|t| tree.size_of(t) <= 60));
        }
        if round == 300 {
            tree.forget(&[0, 3]);
            check(&tree);
        }
    }
    check(&tree);
}

#[test]
fn shared_tree_maintenance_forgets_and_evicts() {
    let shared = SharedTree::default();
    shared.lock().insert(b"aaaa", 1);
    shared.lock().insert(b"bbbbbbbb", 2);
    shared.forget_later(1);
    let upkeep = shared.maintain(4);
    assert_eq!(upkeep.forgotten_nodes, 1);
    assert_eq!(upkeep.evicted_bytes, 8);
    // A racing selection re-inserts a removed worker: the next run cleans it.
    shared.lock().insert(b"aaaa", 1);
    assert_eq!(shared.maintain(100).forgotten_nodes, 1);
    assert_eq!(shared.lock().node_count(), 1);
}

#[test]
fn upkeep_in_small_steps_releases_the_lock_and_spares_what_selections_touch() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let shared = SharedTree::default();
    let prompt = |i: u32| format!("system prompt {} / user turn {i:04}", i % 4).into_bytes();
    for i in 0..300 {
        shared.lock().insert(&prompt(i), u64::from(i % 3));
    }
    let hot = prompt(7);
    let steps = super::shared::Steps { scan: 5, evict: 3 };
    let mut gaps = 0;
    let upkeep = shared.maintain_in_steps(200, steps, || {
        // Selections run between the steps: new prompts, and one old
        // prompt used again.
        gaps += 1;
        let mut tree = shared.try_lock().expect("the upkeep released the lock");
        tree.insert(&prompt(1000 + rng.random_range(0..50)), 2);
        tree.insert(&hot, 1);
    });
    let tree = shared.lock();
    check(&tree);
    assert!(
        gaps > 20 && upkeep.lock_holds == gaps + 2,
        "{gaps} gaps, {upkeep:?}"
    );
    assert!(upkeep.evicted_bytes > 0);
    let mut path = Vec::new();
    tree.walk(&hot, &mut path);
    let last = path.last().expect("the hot prompt is still in the tree");
    assert_eq!(last.matched, hot.len());
    assert!(
        tree.tenants(last.node).contains_key(&1),
        "touched between steps: kept"
    );
    drop(tree);
    // A quiet run afterwards brings every tenant within the bound.
    shared.maintain(200);
    let tree = shared.lock();
    check(&tree);
    assert!((0..3).all(|t| tree.size_of(t) <= 200));
}

#[test]
fn eviction_round_skips_candidates_changed_since_the_scan() {
    let mut tree = PrefixTree::default();
    tree.insert(b"one-old", 1);
    tree.insert(b"two-old", 1);
    let mut round = tree.eviction_round(7).expect("tenant 1 is over the bound");
    assert!(tree.scan_leaves(&mut round, usize::MAX));
    // After the scan a selection uses "one-old" again and extends
    // "two-old": neither candidate is the oldest leaf any more.
    tree.insert(b"one-old", 1);
    tree.insert(b"two-older", 1);
    let (evicted, finished) = tree.evict_some(&mut round, 7, usize::MAX);
    check(&tree);
    assert!(finished);
    assert_eq!(evicted, 0, "every candidate went stale");
    // The next full round finds the current leaves and evicts.
    assert!(tree.evict(7) > 0);
    check(&tree);
    assert!(tree.size_of(1) <= 7);
}
