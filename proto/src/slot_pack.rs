//! Slot changes packed for the wire: per changed worker, only the fields
//! that changed since what the same stream last said about it.
//!
//! A booking changes a replica's slot three times (booked, first byte,
//! released) and a new engine snapshot rebases its work-since-poll once;
//! each change used to travel as a whole [`SlotEntry`] — four counts in
//! bincode varints, ~12 B — and a rebase added a [`BasisEntry`] with a
//! 9-byte poll time. Packed, a change is its worker id as a delta from the
//! previous entry's, a byte saying which fields follow, and those fields as
//! LEB128 varints (a value under 16,384 in two bytes, where bincode takes
//! three from 251): a first byte is ~4 B, a release ~5 B, a rebase ~5 B.
//!
//! The fields are absolute values, never differences, except a basis,
//! which may be sent as milliseconds after the stream's previous basis for
//! that worker (bases only grow). An absent field means "as this stream
//! last said", so the receiver keeps, per stream, the last value of every
//! field (what it heard); a QUIC stream delivers every frame once and in
//! order, and a sender says every field of an entry whenever the stream
//! may not know it (a new id, a transcript copy, the rolling refresh).
//!
//! [`SlotEntry`]: crate::frames::SlotEntry
//! [`BasisEntry`]: crate::frames::BasisEntry

/// Which fields of a [`SlotChange`] follow its id (one bit each).
const REQUESTS: u8 = 1;
const TOKENS: u8 = 1 << 1;
const PENDING_PREFILL: u8 = 1 << 2;
const DISPATCHED: u8 = 1 << 3;
const BASIS_ABSOLUTE: u8 = 1 << 4;
const BASIS_LATER: u8 = 1 << 5;
const KNOWN_BITS: u8 =
    REQUESTS | TOKENS | PENDING_PREFILL | DISPATCHED | BASIS_ABSOLUTE | BASIS_LATER;

/// Most bytes one packed change takes: the id delta (a zigzag `i64`), the
/// field byte, four counts and a basis (a LEB128 `u64` is at most ten).
pub const PACKED_CHANGE_MAX_BYTES: usize = 10 + 1 + 5 * 10;

/// What a change says about the snapshot a worker's work-since-poll counts
/// from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BasisChange {
    /// As this stream last said.
    #[default]
    Same,
    /// This poll time (ms since the Unix epoch, as the sender stored it).
    Absolute(u64),
    /// This many ms after the poll time this stream last said for the
    /// worker.
    Later(u64),
}

/// One worker's slot fields that changed; `None` is "as this stream last
/// said".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotChange {
    /// Sender-local worker id (bound by a `KeyDef`).
    pub id: u32,
    /// Requests in flight.
    pub requests: Option<u64>,
    /// Token-work in flight.
    pub tokens: Option<u64>,
    /// Prompt tokens waiting for a first byte.
    pub pending_prefill: Option<u64>,
    /// Token-work routed since the basis snapshot.
    pub dispatched_since_poll: Option<u64>,
    /// The basis snapshot's poll time.
    pub basis: BasisChange,
}

impl SlotChange {
    /// True when it says nothing beyond its id (nothing to send).
    pub fn is_empty(&self) -> bool {
        self.requests.is_none()
            && self.tokens.is_none()
            && self.pending_prefill.is_none()
            && self.dispatched_since_poll.is_none()
            && self.basis == BasisChange::Same
    }
}

/// Why packed changes could not be read (the frame is dropped, counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackError {
    /// The bytes end inside a change.
    Truncated,
    /// A varint is longer than its type allows.
    Overlong,
    /// A field byte has bits this build does not know, or both basis bits.
    UnknownFields(u8),
    /// An id outside `u32`.
    BadId,
    /// More changes than the reader takes from one frame.
    TooMany,
}

impl std::fmt::Display for PackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PackError::Truncated => write!(f, "packed slot changes end mid-entry"),
            PackError::Overlong => write!(f, "packed slot changes hold an overlong varint"),
            PackError::UnknownFields(b) => write!(f, "unknown slot field bits {b:#04x}"),
            PackError::BadId => write!(f, "packed slot change names an id outside u32"),
            PackError::TooMany => write!(f, "more packed slot changes than a frame may carry"),
        }
    }
}

impl std::error::Error for PackError {}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends `changes` to `out`, each id as a difference from the one before
/// (changes come in id order mostly, so that is a byte or two).
pub fn pack(changes: &[SlotChange], out: &mut Vec<u8>) {
    let mut prev_id = 0i64;
    for c in changes {
        put_varint(out, zigzag(i64::from(c.id) - prev_id));
        prev_id = i64::from(c.id);
        let mut fields = 0u8;
        let counts = [
            (REQUESTS, c.requests),
            (TOKENS, c.tokens),
            (PENDING_PREFILL, c.pending_prefill),
            (DISPATCHED, c.dispatched_since_poll),
        ];
        for (bit, value) in counts {
            if value.is_some() {
                fields |= bit;
            }
        }
        let basis = match c.basis {
            BasisChange::Same => None,
            BasisChange::Absolute(ms) => {
                fields |= BASIS_ABSOLUTE;
                Some(ms)
            }
            BasisChange::Later(ms) => {
                fields |= BASIS_LATER;
                Some(ms)
            }
        };
        out.push(fields);
        for value in counts.iter().filter_map(|(_, v)| *v).chain(basis) {
            put_varint(out, value);
        }
    }
}

/// Reads packed changes, refusing truncated or overlong input and unknown
/// field bits.
pub fn unpack(bytes: &[u8]) -> Result<Vec<SlotChange>, PackError> {
    unpack_at_most(bytes, usize::MAX)
}

/// [`unpack`], refusing more than `limit` changes (a change takes at least
/// two bytes, so at most `bytes.len() / 2` are ever allocated).
pub fn unpack_at_most(mut bytes: &[u8], limit: usize) -> Result<Vec<SlotChange>, PackError> {
    let mut changes = Vec::with_capacity((bytes.len() / 4).min(limit).min(1024));
    let mut prev_id = 0i64;
    while !bytes.is_empty() {
        if changes.len() == limit {
            return Err(PackError::TooMany);
        }
        let id = prev_id
            .checked_add(unzigzag(take_varint(&mut bytes)?))
            .ok_or(PackError::BadId)?;
        let id32 = u32::try_from(id).map_err(|_| PackError::BadId)?;
        prev_id = id;
        let (&fields, rest) = bytes.split_first().ok_or(PackError::Truncated)?;
        bytes = rest;
        let both_bases = BASIS_ABSOLUTE | BASIS_LATER;
        if fields & !KNOWN_BITS != 0 || fields & both_bases == both_bases {
            return Err(PackError::UnknownFields(fields));
        }
        let mut field = |bit: u8| -> Result<Option<u64>, PackError> {
            if fields & bit == 0 {
                return Ok(None);
            }
            take_varint(&mut bytes).map(Some)
        };
        let requests = field(REQUESTS)?;
        let tokens = field(TOKENS)?;
        let pending_prefill = field(PENDING_PREFILL)?;
        let dispatched_since_poll = field(DISPATCHED)?;
        let basis = if let Some(ms) = field(BASIS_ABSOLUTE)? {
            BasisChange::Absolute(ms)
        } else if let Some(ms) = field(BASIS_LATER)? {
            BasisChange::Later(ms)
        } else {
            BasisChange::Same
        };
        changes.push(SlotChange {
            id: id32,
            requests,
            tokens,
            pending_prefill,
            dispatched_since_poll,
            basis,
        });
    }
    Ok(changes)
}

fn take_varint(bytes: &mut &[u8]) -> Result<u64, PackError> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        if i == 9 && b > 1 {
            return Err(PackError::Overlong);
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Ok(value);
        }
    }
    // Every byte carried on (ten would have ended above, or been
    // refused): the varint is cut off.
    Err(PackError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(id: u32) -> SlotChange {
        SlotChange {
            id,
            ..SlotChange::default()
        }
    }

    /// Pinned bytes: two builds read each other's packed changes only while
    /// they agree on these.
    #[test]
    fn known_answers() {
        let changes = [
            // A booking on worker 300: every count, an absolute basis.
            SlotChange {
                id: 300,
                requests: Some(1),
                tokens: Some(900),
                pending_prefill: Some(600),
                dispatched_since_poll: Some(900),
                basis: BasisChange::Absolute(1_700_000_000_000),
            },
            // Its first byte: pending prefill only.
            SlotChange {
                pending_prefill: Some(0),
                ..change(300)
            },
            // A rebase of worker 290, 1,000 ms after its last basis.
            SlotChange {
                dispatched_since_poll: Some(0),
                basis: BasisChange::Later(1_000),
                ..change(290)
            },
        ];
        let mut out = Vec::new();
        pack(&changes, &mut out);
        assert_eq!(
            out,
            [
                // id +300 zigzag = 600 = 0xd8 0x04; fields 0b1_1111; 1;
                // 900 = 0x84 0x07; 600 = 0xd8 0x04; 900; 1.7e12 in 6 bytes.
                0xd8, 0x04, 0x1f, 1, 0x84, 0x07, 0xd8, 0x04, 0x84, 0x07, 0x80, 0xd0, 0x95, 0xff,
                0xbc, 0x31, // id +0, pending prefill 0.
                0, 0x04, 0, // id −10 zigzag = 19, dispatched 0, basis +1,000.
                19, 0x28, 0, 0xe8, 0x07,
            ]
        );
        assert_eq!(unpack(&out).unwrap(), changes);
    }

    #[test]
    fn round_trips_extremes() {
        let changes = [
            SlotChange {
                id: u32::MAX,
                requests: Some(u64::MAX),
                tokens: Some(0),
                pending_prefill: None,
                dispatched_since_poll: Some(127),
                basis: BasisChange::Later(u64::MAX),
            },
            change(0),
            SlotChange {
                tokens: Some(128),
                basis: BasisChange::Absolute(0),
                ..change(u32::MAX)
            },
        ];
        let mut out = Vec::new();
        pack(&changes, &mut out);
        assert!(out.len() <= changes.len() * PACKED_CHANGE_MAX_BYTES);
        assert_eq!(unpack(&out).unwrap(), changes);
        assert_eq!(unpack(&[]).unwrap(), []);
        assert!(change(7).is_empty());
        assert!(changes[1].is_empty());
        assert!(!changes[0].is_empty() && !changes[2].is_empty());
    }

    #[test]
    fn refuses_bad_input() {
        // Ends after the id.
        assert_eq!(unpack(&[2]), Err(PackError::Truncated));
        // A field byte promising requests, then nothing.
        assert_eq!(unpack(&[2, 0x01]), Err(PackError::Truncated));
        // A varint that never ends within ten bytes.
        assert_eq!(unpack(&[0xff; 11]), Err(PackError::Overlong));
        // Ten bytes whose last carries past 64 bits.
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert_eq!(unpack(&over), Err(PackError::Overlong));
        // Unknown bits, and both kinds of basis at once.
        assert_eq!(unpack(&[0, 0x40]), Err(PackError::UnknownFields(0x40)));
        assert_eq!(
            unpack(&[0, 0x30, 1, 1]),
            Err(PackError::UnknownFields(0x30))
        );
        // An id below zero, and one past u32.
        assert_eq!(unpack(&[1, 0]), Err(PackError::BadId));
        let mut big = Vec::new();
        put_varint(&mut big, zigzag(i64::from(u32::MAX) + 1));
        big.push(0);
        assert_eq!(unpack(&big), Err(PackError::BadId));
        // Three changes read with a limit of two.
        let mut three = Vec::new();
        pack(&[change(1), change(2), change(3)], &mut three);
        assert_eq!(unpack_at_most(&three, 2), Err(PackError::TooMany));
        assert_eq!(unpack_at_most(&three, 3).unwrap().len(), 3);
    }
}
