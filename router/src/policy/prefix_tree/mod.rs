//! The approximate prefix tree of `cache_aware`: which worker has probably
//! cached which prompt prefix.
//!
//! Logically there is one tree per worker ("tenant"); physically they share
//! one radix tree over the prompt's UTF-8 bytes whose nodes carry the set of
//! tenants that hold them, with a last-access tick per tenant (as in the
//! SGLang gateway). Matching a prompt therefore costs O(prompt length), not
//! O(workers × prompt length). Invariant: a tenant present on a node is
//! present on all its ancestors, so the deeper a node, the fewer tenants.
//!
//! "Approximate": the tree records what the router sent, not what the
//! engine kept. Each tenant's size (bytes of edges it holds) is bounded by
//! eviction of its least recently used leaves ([`evict`]), which runs off
//! the request path. Nodes are kept in an arena and addressed by `u32`.

mod evict;
mod shared;
#[cfg(test)]
mod tests;

pub(crate) use shared::SharedTree;
pub use shared::TreeUpkeep;

/// A worker as the tree knows it: [`crate::workers::Worker::id`].
pub(crate) type Tenant = u64;

/// A map keyed by tenant id.
pub(crate) type IdMap<V> = crate::id_hash::IdMap<Tenant, V>;

const ROOT: u32 = 0;
/// `parent` of a slot on the free list.
const FREE: u32 = u32::MAX;

#[derive(Debug, Default)]
struct Node {
    /// Bytes on the edge from the parent to this node (empty for the root).
    edge: Box<[u8]>,
    parent: u32,
    /// (first byte of the child's edge, child), sorted by byte.
    children: Vec<(u8, u32)>,
    /// Tenants holding this node -> their last access tick.
    tenants: IdMap<u64>,
}

/// One node on a prompt's matched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    /// The node.
    pub(crate) node: u32,
    /// Prompt bytes matched down to and within this node.
    pub(crate) matched: usize,
}

/// The radix tree itself; see the module docs. Not synchronised: the
/// policy wraps it in [`SharedTree`].
#[derive(Debug)]
pub(crate) struct PrefixTree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Bytes held per tenant.
    sizes: IdMap<usize>,
    clock: u64,
}

impl Default for PrefixTree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            sizes: IdMap::default(),
            clock: 0,
        }
    }
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixTree {
    fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let children = &self.nodes[node as usize].children;
        children
            .binary_search_by_key(&byte, |(b, _)| *b)
            .ok()
            .map(|i| children[i].1)
    }

    /// Appends to `out` every node on the path `text` follows, shallowest
    /// first, with the bytes matched so far (the last one may be matched
    /// only part-way: its tenants hold the whole edge, so they hold that
    /// part too).
    pub(crate) fn walk(&self, text: &[u8], out: &mut Vec<Level>) {
        let mut node = ROOT;
        let mut pos = 0;
        while let Some(&byte) = text.get(pos) {
            let Some(child) = self.child(node, byte) else {
                break;
            };
            let edge = &self.nodes[child as usize].edge;
            let common = common_prefix(edge, &text[pos..]);
            pos += common;
            out.push(Level {
                node: child,
                matched: pos,
            });
            if common < edge.len() {
                break;
            }
            node = child;
        }
    }

    /// Tenants holding `node`, with their last access ticks.
    pub(crate) fn tenants(&self, node: u32) -> &IdMap<u64> {
        &self.nodes[node as usize].tenants
    }

    /// Bytes `tenant` holds.
    pub(crate) fn size_of(&self, tenant: Tenant) -> usize {
        self.sizes.get(&tenant).copied().unwrap_or(0)
    }

    /// Live nodes, the root included.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Records that `tenant` was sent `text`: marks every node on its path
    /// as held by the tenant now, splitting an edge where the text leaves
    /// it and adding a leaf for the unseen rest.
    pub(crate) fn insert(&mut self, text: &[u8], tenant: Tenant) {
        self.clock += 1;
        let tick = self.clock;
        let mut node = ROOT;
        let mut pos = 0;
        while let Some(&byte) = text.get(pos) {
            let Some(child) = self.child(node, byte) else {
                let rest = &text[pos..];
                let Some(leaf) = self.alloc(Node {
                    edge: rest.into(),
                    parent: node,
                    children: Vec::new(),
                    tenants: IdMap::default(),
                }) else {
                    return;
                };
                self.link(node, byte, leaf);
                self.touch(leaf, tenant, tick);
                return;
            };
            let common = common_prefix(&self.nodes[child as usize].edge, &text[pos..]);
            let held = if common < self.nodes[child as usize].edge.len() {
                match self.split(child, common) {
                    Some(mid) => mid,
                    None => return,
                }
            } else {
                child
            };
            self.touch(held, tenant, tick);
            pos += common;
            node = held;
        }
    }

    /// Marks `node` as held by `tenant` at `tick`, growing its size if new.
    fn touch(&mut self, node: u32, tenant: Tenant, tick: u64) {
        let slot = &mut self.nodes[node as usize];
        if slot.tenants.insert(tenant, tick).is_none() {
            *self.sizes.entry(tenant).or_default() += slot.edge.len();
        }
    }

    /// Splits `node`'s edge after `at` bytes (0 < at < len): a new parent
    /// takes the first `at` bytes and the node's tenants. Sizes are unchanged.
    fn split(&mut self, node: u32, at: usize) -> Option<u32> {
        let old = &self.nodes[node as usize];
        let (Some(&first), Some(&tail_first)) = (old.edge.first(), old.edge.get(at)) else {
            return None;
        };
        let mid = self.alloc(Node {
            edge: old.edge[..at].into(),
            parent: old.parent,
            children: vec![(tail_first, node)],
            tenants: old.tenants.clone(),
        })?;
        let old = &mut self.nodes[node as usize];
        old.edge = old.edge[at..].into();
        let parent = old.parent;
        old.parent = mid;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(i) = siblings.binary_search_by_key(&first, |(b, _)| *b) {
            siblings[i].1 = mid;
        }
        Some(mid)
    }

    fn link(&mut self, parent: u32, byte: u8, child: u32) {
        let children = &mut self.nodes[parent as usize].children;
        let at = children.partition_point(|(b, _)| *b < byte);
        children.insert(at, (byte, child));
    }

    /// A slot for `node`; `None` only past 2^32 - 1 nodes, far beyond
    /// what any tree bound lets live (the insert then stops short).
    fn alloc(&mut self, node: Node) -> Option<u32> {
        if let Some(slot) = self.free.pop() {
            self.nodes[slot as usize] = node;
            return Some(slot);
        }
        let slot = u32::try_from(self.nodes.len())
            .ok()
            .filter(|s| *s != FREE)?;
        self.nodes.push(node);
        Some(slot)
    }
}
