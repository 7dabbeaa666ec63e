//! A msgpack reader over a borrowed payload, for the KV-event decoder,
//! which reads a batch in one pass, field by field, without building a
//! value tree. A `BlockStored` carries every token of its blocks; decoded
//! into a tree, each token became a node, and that was most of the CPU a
//! replica spent on events (tests/BENCHMARKS.md).

/// Why bytes are not one msgpack value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MsgpackError {
    /// The input ends inside a value.
    Truncated,
    /// A byte that starts no value (0xc1, the one unused marker).
    Reserved,
    /// Containers nest deeper than the limit.
    TooDeep,
}

impl std::fmt::Display for MsgpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MsgpackError::Truncated => "the payload ends inside a value",
            MsgpackError::Reserved => "the reserved marker 0xc1",
            MsgpackError::TooDeep => "containers nest too deep",
        })
    }
}

/// What a value is, with what is needed to read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Item<'a> {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    Uint(u64),
    /// A negative integer.
    Int(i64),
    /// A float (32-bit ones widened).
    Float(f64),
    /// A string's bytes (not checked to be UTF-8).
    Str(&'a [u8]),
    /// Binary bytes.
    Bin(&'a [u8]),
    /// An array of this many values, which follow.
    Array(usize),
    /// A map of this many key/value pairs, which follow.
    Map(usize),
    /// An extension value (type and bytes).
    Ext(&'a [u8]),
}

impl<'a> Item<'a> {
    /// The value as a UTF-8 string, if it is one.
    pub fn as_str(&self) -> Option<&'a str> {
        match self {
            Item::Str(bytes) => std::str::from_utf8(bytes).ok(),
            _ => None,
        }
    }

    /// The value as a `u64`, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Item::Uint(n) => Some(n),
            _ => None,
        }
    }

    /// The value as an `i64`, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Item::Uint(n) => i64::try_from(n).ok(),
            Item::Int(n) => Some(n),
            _ => None,
        }
    }

    /// The value as an `f64`, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Item::Uint(n) => Some(n as f64),
            Item::Int(n) => Some(n as f64),
            Item::Float(x) => Some(x),
            _ => None,
        }
    }
}

/// A cursor over msgpack bytes.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        if self.rest.len() < n {
            return Err(MsgpackError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn be(&mut self, n: usize) -> Result<u64, MsgpackError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, MsgpackError> {
        usize::try_from(self.be(n)?).map_err(|_| MsgpackError::Truncated)
    }

    /// Reads one item's head (and a string's or binary's bytes); the
    /// elements of an array or map are left to read.
    pub fn item(&mut self) -> Result<Item<'a>, MsgpackError> {
        let marker = self.take(1)?[0];
        Ok(match marker {
            0x00..=0x7f => Item::Uint(u64::from(marker)),
            0x80..=0x8f => Item::Map(usize::from(marker & 0x0f)),
            0x90..=0x9f => Item::Array(usize::from(marker & 0x0f)),
            0xa0..=0xbf => Item::Str(self.take(usize::from(marker & 0x1f))?),
            0xc0 => Item::Nil,
            0xc1 => return Err(MsgpackError::Reserved),
            0xc2 => Item::Bool(false),
            0xc3 => Item::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (marker - 0xc4))?;
                Item::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (marker - 0xc7))?;
                Item::Ext(self.take(n.checked_add(1).ok_or(MsgpackError::Truncated)?)?)
            }
            0xca => Item::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Item::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Item::Uint(self.be(1 << (marker - 0xcc))?),
            0xd0 => Item::Int(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => Item::Int(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => Item::Int(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => Item::Int(self.be(8)? as i64),
            0xd4..=0xd8 => Item::Ext(self.take((1 << (marker - 0xd4)) + 1)?),
            0xd9..=0xdb => {
                let n = self.len(1 << (marker - 0xd9))?;
                Item::Str(self.take(n)?)
            }
            0xdc..=0xdd => Item::Array(self.len(2 << (marker - 0xdc))?),
            0xde..=0xdf => Item::Map(self.len(2 << (marker - 0xde))?),
            0xe0..=0xff => Item::Int(i64::from(marker as i8)),
        })
        .map(|item| match item {
            // msgpack's signed forms may hold non-negative numbers.
            Item::Int(n) if n >= 0 => Item::Uint(n as u64),
            other => other,
        })
    }

    /// A non-negative integer in a positive fixint or one of the unsigned
    /// forms, read without the general item path (token ids and block
    /// hashes are nearly every byte of a batch); `None`, with nothing
    /// consumed, for any other value or a truncated one, which the caller
    /// then reads with [`Reader::item`].
    #[inline]
    pub fn uint(&mut self) -> Option<u64> {
        let (&marker, rest) = self.rest.split_first()?;
        let (value, used) = match marker {
            0x00..=0x7f => (u64::from(marker), 0),
            0xcc => (u64::from(*rest.first()?), 1),
            0xcd => (
                u64::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?)),
                2,
            ),
            0xce => (
                u64::from(u32::from_be_bytes(rest.get(..4)?.try_into().ok()?)),
                4,
            ),
            0xcf => (u64::from_be_bytes(rest.get(..8)?.try_into().ok()?), 8),
            _ => return None,
        };
        self.rest = rest.get(used..)?;
        Some(value)
    }

    /// Skips one whole value, containers nested at most `depth` deep.
    pub fn skip(&mut self, depth: usize) -> Result<(), MsgpackError> {
        let head = self.item()?;
        self.skip_contents(head, depth)
    }

    /// Skips what follows `head`, an item just read: an array's elements
    /// or a map's entries (nothing for a scalar), with `head` counted as
    /// one of the `depth` levels containers may nest.
    pub fn skip_contents(&mut self, head: Item<'_>, depth: usize) -> Result<(), MsgpackError> {
        let count = match head {
            Item::Array(n) => n,
            Item::Map(n) => n.checked_mul(2).ok_or(MsgpackError::Truncated)?,
            _ => return Ok(()),
        };
        let depth = depth.checked_sub(1).ok_or(MsgpackError::TooDeep)?;
        for _ in 0..count {
            self.skip(depth)?;
        }
        Ok(())
    }

    /// The bytes of the next whole value (skipped, at most `depth` deep).
    pub fn value(&mut self, depth: usize) -> Result<&'a [u8], MsgpackError> {
        let start = self.rest;
        self.skip(depth)?;
        Ok(&start[..start.len() - self.rest.len()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_marker_family_reads_as_its_item() {
        let cases: [(&[u8], Item<'_>); 14] = [
            (&[0x05], Item::Uint(5)),
            (&[0xff], Item::Int(-1)),
            (&[0xd0, 0x80], Item::Int(-128)),
            (&[0xd0, 0x05], Item::Uint(5)),
            (&[0xcd, 0x01, 0x00], Item::Uint(256)),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Item::Uint(u64::MAX),
            ),
            (&[0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0], Item::Int(i64::MIN)),
            (&[0xa2, b'h', b'i'], Item::Str(b"hi")),
            (&[0xc4, 0x01, 0x07], Item::Bin(&[7])),
            (&[0x92], Item::Array(2)),
            (&[0xde, 0x00, 0x03], Item::Map(3)),
            (&[0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0], Item::Float(1.5)),
            (&[0xc0], Item::Nil),
            (&[0xd4, 0x01, 0x02], Item::Ext(&[1, 2])),
        ];
        for (bytes, want) in cases {
            let mut reader = Reader::new(bytes);
            assert_eq!(reader.item(), Ok(want), "{bytes:x?}");
            assert_eq!(reader.remaining(), 0, "{bytes:x?}");
        }
    }

    #[test]
    fn malformed_values_are_errors() {
        assert_eq!(Reader::new(&[0xc1]).skip(4), Err(MsgpackError::Reserved));
        assert_eq!(
            Reader::new(&[0x92, 0x01]).skip(4),
            Err(MsgpackError::Truncated)
        );
        assert_eq!(
            Reader::new(&[0xa3, b'a']).skip(4),
            Err(MsgpackError::Truncated)
        );
        assert_eq!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).skip(4),
            Err(MsgpackError::Truncated)
        );
        let nested = [0x91u8; 5];
        let mut deep = nested.to_vec();
        deep.push(0x00);
        assert_eq!(Reader::new(&deep).skip(4), Err(MsgpackError::TooDeep));
        assert_eq!(Reader::new(&deep).skip(5), Ok(()));
        let mut reader = Reader::new(&[0x92, 0x01, 0xa1, b'x', 0xc0]);
        assert_eq!(reader.value(2), Ok(&[0x92, 0x01, 0xa1, b'x'][..]));
        assert_eq!(reader.remaining(), 1);
    }

    /// Pseudo-random msgpack values of every kind, encoded by `rmpv`.
    fn random_value(state: &mut u64, depth: usize) -> rmpv::Value {
        use rmpv::Value;
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let pick = *state % if depth == 0 { 9 } else { 11 };
        let n = (*state >> 8) as usize % 20;
        match pick {
            0 => Value::Nil,
            1 => Value::Boolean(n.is_multiple_of(2)),
            2 => Value::from(*state >> (n * 3)),
            3 => Value::from(-((*state >> (n * 3 + 1)) as i64)),
            4 => Value::F32(n as f32 / 4.0),
            5 => Value::F64(-(n as f64) / 8.0),
            6 => Value::from("x".repeat(n * n)),
            7 => Value::Binary(vec![7; n * 17]),
            8 => Value::Ext(3, vec![1; [1, 2, 4, 8, 16, 3][n % 6]]),
            9 => Value::Array((0..n).map(|_| random_value(state, depth - 1)).collect()),
            _ => Value::Map(
                (0..n / 2)
                    .map(|_| {
                        (
                            random_value(state, depth - 1),
                            random_value(state, depth - 1),
                        )
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn reads_exactly_what_rmpv_writes() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..2000 {
            let value = random_value(&mut state, 3);
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &value).unwrap();
            bytes.push(0xc0);
            let mut reader = Reader::new(&bytes);
            assert_eq!(reader.skip(4), Ok(()), "{value:?}");
            assert_eq!(reader.remaining(), 1, "{value:?}");
            let head = Reader::new(&bytes).item().unwrap();
            let same = match (&value, head) {
                (rmpv::Value::Nil, Item::Nil) => true,
                (rmpv::Value::Boolean(b), Item::Bool(c)) => *b == c,
                (rmpv::Value::Integer(i), Item::Uint(n)) => i.as_u64() == Some(n),
                (rmpv::Value::Integer(i), Item::Int(n)) => i.as_i64() == Some(n) && n < 0,
                (rmpv::Value::F32(x), Item::Float(y)) => f64::from(*x) == y,
                (rmpv::Value::F64(x), Item::Float(y)) => *x == y,
                (rmpv::Value::String(s), Item::Str(b)) => s.as_bytes() == b,
                (rmpv::Value::Binary(a), Item::Bin(b)) => a[..] == *b,
                (rmpv::Value::Ext(_, a), Item::Ext(b)) => a[..] == b[1..],
                (rmpv::Value::Array(a), Item::Array(n)) => a.len() == n,
                (rmpv::Value::Map(m), Item::Map(n)) => m.len() == n,
                _ => false,
            };
            assert!(same, "{value:?} read as {head:?}");
        }
    }
}
