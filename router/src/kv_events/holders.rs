//! The streams holding one block, sorted, in 16 bytes: most blocks are
//! held by one engine (a prompt's private tail), so that case is inline
//! and only shared blocks allocate. A `Vec` here cost 24 bytes plus a heap
//! allocation for every block; the index holds millions of them.
//!
//! A shared list carries a fingerprint of its set (the XOR of each id's
//! mixed bits) ahead of the ids, in the same allocation: a prompt's walk
//! down a block prefix that a thousand engines share compares each
//! block's holders with the streams still matching, and a length and a
//! fingerprint decide that from one cache line instead of the whole list.

use super::index::StreamId;

/// Sorted, distinct stream ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holders {
    /// Held by one stream (no allocation).
    One(StreamId),
    /// Held by two or more: the set's fingerprint as two ids (low and high
    /// 32 bits), then the ids ascending.
    Many(Box<[StreamId]>),
}

/// Ids before the holders in a [`Holders::Many`] list: the fingerprint.
const HEADER: usize = 2;

/// One stream's share of a set's fingerprint.
pub fn fingerprint_of(stream: StreamId) -> u64 {
    let mut z = u64::from(stream.0).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The fingerprint of a set of streams (the XOR of their shares; equal
/// sets have equal fingerprints, different ones collide with odds 2⁻⁶⁴).
pub fn fingerprint(streams: &[StreamId]) -> u64 {
    streams.iter().fold(0, |f, s| f ^ fingerprint_of(*s))
}

impl Holders {
    /// The ids, ascending.
    pub fn as_slice(&self) -> &[StreamId] {
        match self {
            Holders::One(id) => std::slice::from_ref(id),
            Holders::Many(ids) => ids.get(HEADER..).unwrap_or_default(),
        }
    }

    /// How many streams hold the block.
    pub fn len(&self) -> usize {
        match self {
            Holders::One(_) => 1,
            Holders::Many(ids) => ids.len().saturating_sub(HEADER),
        }
    }

    /// Whether no stream holds it (never, for a stored entry).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The set's [`fingerprint`], without reading the ids.
    pub fn fingerprint(&self) -> u64 {
        match self {
            Holders::One(id) => fingerprint_of(*id),
            Holders::Many(ids) => match ids.get(..HEADER) {
                Some([low, high]) => u64::from(low.0) | (u64::from(high.0) << 32),
                _ => 0,
            },
        }
    }

    /// The holders `ids` (ascending, distinct, at least one).
    fn of(ids: &[StreamId]) -> Self {
        match ids {
            [one] => Holders::One(*one),
            _ => {
                let f = fingerprint(ids);
                let mut list = Vec::with_capacity(HEADER + ids.len());
                list.push(StreamId(f as u32));
                list.push(StreamId((f >> 32) as u32));
                list.extend_from_slice(ids);
                Holders::Many(list.into_boxed_slice())
            }
        }
    }

    /// Adds `stream` (no-op if held).
    pub fn insert(&mut self, stream: StreamId) {
        let ids = self.as_slice();
        let Err(at) = ids.binary_search(&stream) else {
            return;
        };
        let mut grown = Vec::with_capacity(ids.len() + 1);
        grown.extend_from_slice(&ids[..at]);
        grown.push(stream);
        grown.extend_from_slice(&ids[at..]);
        *self = Holders::of(&grown);
    }

    /// Removes `stream`; `false` when no stream is left (drop the entry).
    pub fn remove(&mut self, stream: StreamId) -> bool {
        let ids = self.as_slice();
        let Ok(at) = ids.binary_search(&stream) else {
            return true;
        };
        if ids.len() == 1 {
            return false;
        }
        let rest: Vec<StreamId> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != at)
            .map(|(_, s)| *s)
            .collect();
        *self = Holders::of(&rest);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_sorted_and_inline_for_one() {
        assert_eq!(std::mem::size_of::<Holders>(), 16);
        let mut h = Holders::One(StreamId(5));
        h.insert(StreamId(5));
        assert_eq!(h, Holders::One(StreamId(5)));
        h.insert(StreamId(2));
        h.insert(StreamId(9));
        assert_eq!(h.as_slice(), [StreamId(2), StreamId(5), StreamId(9)]);
        assert_eq!(h.len(), 3);
        assert!(h.remove(StreamId(5)));
        assert!(h.remove(StreamId(7)), "absent: nothing changes");
        assert!(h.remove(StreamId(2)));
        assert_eq!(h, Holders::One(StreamId(9)));
        assert!(h.remove(StreamId(1)));
        assert!(!h.remove(StreamId(9)), "the last one leaves it empty");
    }

    #[test]
    fn the_fingerprint_follows_the_set_whatever_the_order_of_changes() {
        let mut a = Holders::One(StreamId(1));
        for s in [7, 3, 9, 4] {
            a.insert(StreamId(s));
        }
        a.remove(StreamId(9));
        let mut b = Holders::One(StreamId(4));
        for s in [3, 1, 7] {
            b.insert(StreamId(s));
        }
        assert_eq!(a.as_slice(), b.as_slice());
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), fingerprint(a.as_slice()));
        b.insert(StreamId(8));
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(
            Holders::One(StreamId(3)).fingerprint(),
            fingerprint(&[StreamId(3)])
        );
    }
}
