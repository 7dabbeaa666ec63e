//! The streams holding one block, sorted, in 16 bytes: most blocks are
//! held by one engine (a prompt's private tail), so that case is inline
//! and only shared blocks allocate. A `Vec` here cost 24 bytes plus a heap
//! allocation for every block; the index holds millions of them.

use super::index::StreamId;

/// Sorted, distinct stream ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holders {
    /// Held by one stream (no allocation).
    One(StreamId),
    /// Held by two or more, ascending.
    Many(Box<[StreamId]>),
}

impl Holders {
    /// The ids, ascending.
    pub fn as_slice(&self) -> &[StreamId] {
        match self {
            Holders::One(id) => std::slice::from_ref(id),
            Holders::Many(ids) => ids,
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
        *self = Holders::Many(grown.into_boxed_slice());
    }

    /// Removes `stream`; `false` when no stream is left (drop the entry).
    pub fn remove(&mut self, stream: StreamId) -> bool {
        match self {
            Holders::One(id) => *id != stream,
            Holders::Many(ids) => {
                let Ok(at) = ids.binary_search(&stream) else {
                    return true;
                };
                let rest: Vec<StreamId> = ids
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != at)
                    .map(|(_, s)| *s)
                    .collect();
                *self = match rest.as_slice() {
                    [] => return false,
                    [one] => Holders::One(*one),
                    _ => Holders::Many(rest.into_boxed_slice()),
                };
                true
            }
        }
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
        assert!(h.remove(StreamId(5)));
        assert!(h.remove(StreamId(7)), "absent: nothing changes");
        assert!(h.remove(StreamId(2)));
        assert_eq!(h, Holders::One(StreamId(9)));
        assert!(h.remove(StreamId(1)));
        assert!(!h.remove(StreamId(9)), "the last one leaves it empty");
    }
}
