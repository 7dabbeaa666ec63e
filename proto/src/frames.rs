//! The frames replicas exchange on the mesh load plane.
//!
//! Every frame travels as a 4-byte big-endian length followed by a bincode
//! body (`bincode::config::standard()`, varint integers). The body is an
//! [`Envelope`] whose first field is the wire version, so a replica can
//! reject a frame from a newer protocol instead of misreading it. Decoding
//! always runs with a hard byte limit ([`MAX_FRAME_BYTES`]): a hostile length
//! prefix cannot make the receiver allocate more than that, and a frame that
//! fails to decode is dropped and counted by the caller, never trusted.
//!
//! Slot and snapshot entries name workers by a small integer id the sender
//! assigns; the sender defines each id once per connection ([`KeyDef`])
//! before or in the same frame as its first use, which keeps a steady-state
//! delta at a few bytes per changed worker.

use serde::{Deserialize, Serialize};

use crate::counts::LoadCounts;
use crate::load::{EngineKind, EngineLoad};
pub use crate::tenant_frames::{
    MAX_TENANT_NAME_BYTES, MAX_TENANT_SECONDS, MAX_TENANTS_PER_FRAME, TenantEntry, TenantSecond,
    TenantsFrame,
};

/// Wire version of [`Envelope`]; bumped on any incompatible change.
/// Version 2: slots carry work since the sender's known snapshot (not a
/// lifetime total), key definitions say whether the sender polls the key.
pub const FRAME_VERSION: u16 = 2;

/// Largest frame body, in bytes, that a receiver accepts and decodes.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Largest worker key, in bytes, that a receiver accepts.
pub const MAX_KEY_BYTES: usize = 2048;

/// The outer shell of every frame: wire version, then the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Wire version the sender speaks ([`FRAME_VERSION`]).
    pub version: u16,
    /// The message itself.
    pub frame: Frame,
}

/// One message on a replica's outbound load stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Frame {
    /// First frame on a stream: who is speaking. The receiver checks the
    /// claimed name against the peer's TLS certificate.
    Hello(Hello),
    /// Slot values and snapshots of the sending incarnation.
    Update(Update),
    /// The sender is leaving the cluster gracefully: stop counting it now.
    Bye,
    /// The sender's copy of the fleet-wide worker set (added after wire
    /// version 2 shipped, as the last variant: a build without it drops
    /// these frames as undecodable, counted, and keeps the session, so
    /// replicas of both builds still share load during a rolling upgrade).
    Workers(WorkerSetFrame),
    /// Keys of prompts the sender routed for the first time (appended after
    /// `Workers`, the same way: an older build drops it, counted, and keeps
    /// the session). Lets every replica's affinity policy treat a prompt
    /// prefix seen anywhere in the fleet as seen.
    Sightings(SightingsFrame),
    /// A digest of the sender's worker set (appended after `Sightings`,
    /// the same way: an older build drops it, counted, and keeps the
    /// session). A receiver whose own digest differs in a bucket sends back
    /// its entries of that bucket, so what either side missed or refused is
    /// repaired without anyone resending the whole set.
    WorkersDigest(WorkerDigestFrame),
    /// Where stored objects live: ids of objects (responses, files,
    /// batches) an engine created through the sender, and that engine
    /// (appended last, after `WorkersDigest`, the same way: an older build drops it, counted, and
    /// keeps the session). Lets any replica route a request about an
    /// object to the engine that holds it.
    Objects(ObjectsFrame),
    /// What the sender's receiving side reads beyond wire version 2
    /// (appended after `Objects`, the same way: an older build drops it,
    /// counted, and keeps the session). Sent once, right after `Hello`; a
    /// peer that never sends it is sent only the frames every version-2
    /// build reads.
    Speaks(Speaks),
    /// Slot changes packed field by field against what the same stream
    /// said before (appended last; sent only to a peer whose [`Speaks`]
    /// names [`Speaks::PACKED_SLOTS`]). See [`crate::slot_pack`].
    Packed(PackedUpdate),
    /// The sender's own per-tenant usage that changed since its last
    /// frame (appended last, the same way: an older build drops it,
    /// counted, and keeps the session). Absolute values, one writer per
    /// incarnation, so a frame applied twice or a newer one overwriting
    /// an older changes nothing but what is newer.
    Tenants(TenantsFrame),
}

/// Optional parts of the protocol the sender reads, as bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Speaks {
    /// Bits of the features; a receiver ignores bits it does not know.
    pub features: u64,
}

impl Speaks {
    /// Reads [`Frame::Packed`].
    pub const PACKED_SLOTS: u64 = 1;

    /// True if every bit of `feature` is set.
    pub fn has(&self, feature: u64) -> bool {
        self.features & feature == feature
    }
}

/// An [`Update`] whose slots and bases travel as packed changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PackedUpdate {
    /// As [`Update::round`].
    pub round: u64,
    /// As [`Update::prev_read_at_unix_us`].
    pub prev_read_at_unix_us: u64,
    /// Worker ids defined by this frame.
    pub keys: Vec<KeyDef>,
    /// The changed slots and bases, packed by [`crate::slot_pack::pack`].
    pub slots: Vec<u8>,
    /// As [`Update::snapshots`].
    pub snapshots: Vec<SnapshotEntry>,
}

/// Most entries one [`ObjectsFrame`] carries; a receiver drops, counted, a
/// frame with more (a sender splits its batch into frames of this size).
/// With ids of at most [`MAX_OBJECT_ID_BYTES`] and worker URLs of at most
/// [`MAX_KEY_BYTES`], a full frame stays under [`MAX_FRAME_BYTES`].
pub const MAX_OBJECTS_PER_FRAME: usize = 256;

/// Longest object id, in bytes, a receiver accepts (engines' ids are a
/// prefix and a UUID: `resp_…`, `file-…`, `batch_…`).
pub const MAX_OBJECT_ID_BYTES: usize = 128;

/// Objects the sender saw created since its last frame.
///
/// An id is generated by the engine (not taken from request content) and
/// the worker is a URL every replica already knows from the worker set:
/// a peer learns only that an object with that id exists on that engine,
/// which any client holding the id could find out by asking. The object
/// itself never travels, and the entries go only over the mTLS load link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectsFrame {
    /// The entries, at most [`MAX_OBJECTS_PER_FRAME`].
    pub entries: Vec<ObjectEntry>,
}

/// One stored object and the engine that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectEntry {
    /// The object's id as its engine gave it (at most
    /// [`MAX_OBJECT_ID_BYTES`]).
    pub id: String,
    /// The holding worker's base URL (at most [`MAX_KEY_BYTES`]).
    pub worker: String,
}

/// Buckets of a [`WorkerDigestFrame`]; a frame with another count is
/// dropped, counted (a build that changes it must change the frame too).
pub const WORKER_DIGEST_BUCKETS: usize = 64;

/// The sender's worker set, summarised: per bucket of URLs, the XOR of a
/// 64-bit hash of each entry (URL, stamp, origin, present), as the mesh's
/// `worker_set::digest` computes it (pinned by its known-answer tests).
/// Equal buckets hold equal entries (but for a 2^-64 chance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDigestFrame {
    /// [`WORKER_DIGEST_BUCKETS`] hashes, bucket by bucket.
    pub buckets: Vec<u64>,
}

/// Most keys one [`SightingsFrame`] carries; a receiver drops, counted, a
/// frame with more (a sender splits its batch into frames of this size).
pub const MAX_SIGHTINGS_PER_FRAME: usize = 8192;

/// Prompt keys the sender saw for the first time since its last frame.
///
/// A key is a 64-bit hash of a prompt's first blocks (the policy's
/// `affinity_key`), never prompt text: a peer learns only that some client
/// sent a prompt with that prefix, which it could learn by receiving the
/// same request itself; the hash cannot be turned back into text without
/// guessing the whole prefix, and it travels only on the mTLS load link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SightingsFrame {
    /// The keys, at most [`MAX_SIGHTINGS_PER_FRAME`].
    pub keys: Vec<u64>,
}

/// Entries of the fleet-wide worker set (what admins added and removed on
/// any replica), each a last-writer-wins register per worker URL. A frame
/// may carry part of the set; every entry merges on its own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSetFrame {
    /// The entries.
    pub entries: Vec<WorkerSetEntry>,
}

/// One worker URL's register: whether it is in the set, and the stamp of
/// the write that said so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSetEntry {
    /// The worker's base URL (at most [`MAX_KEY_BYTES`]).
    pub url: String,
    /// Hybrid logical clock of the write: µs since the Unix epoch on the
    /// writer's clock, raised past every stamp it had seen.
    pub hlc_us: u64,
    /// Node name of the writer (ties between equal clocks break on it).
    pub origin: String,
    /// Added (`true`) or removed (`false`, a tombstone).
    pub present: bool,
}

/// The sender's identity, checked against its certificate and gossip entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Cluster the sender belongs to; frames for another cluster are refused.
    pub cluster_id: String,
    /// Node name (must match a DNS name in the sender's certificate).
    pub node: String,
    /// Generation of this incarnation (its start time, grows on restart).
    pub generation: u64,
}

/// A batch of the sender's own state, all read at the same instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// Strictly increasing per sender incarnation: the version of every slot
    /// entry in this frame (receivers keep the highest per worker).
    pub round: u64,
    /// Sender wall clock (µs since the Unix epoch) of the previous read of
    /// its slots on this stream (0 if none): every change carried here
    /// happened after it, so `now - prev` bounds how stale it arrives.
    pub prev_read_at_unix_us: u64,
    /// Worker ids defined by this frame.
    pub keys: Vec<KeyDef>,
    /// In-flight slots that changed (or all of them, in a full sync).
    pub slots: Vec<SlotEntry>,
    /// Which snapshot each slot's `dispatched_since_poll` counts from,
    /// where that changed (or all of them, in a full sync). Apart from the
    /// slots because it changes once per poll, not once per booking.
    pub bases: Vec<BasisEntry>,
    /// Snapshots this sender polled that its peer has not seen yet.
    pub snapshots: Vec<SnapshotEntry>,
}

impl Update {
    /// True when the frame carries no state (a pure heartbeat).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
            && self.slots.is_empty()
            && self.bases.is_empty()
            && self.snapshots.is_empty()
    }
}

/// Binds a sender-local worker id to the worker's key (its base URL), and
/// says whether the sender polls that worker's load (poll ownership is
/// shared only among the replicas that do). Sent before an id's first use,
/// whenever the polling flag changes, and in every full sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDef {
    /// Sender-local id (ids of removed keys are reused after a new `KeyDef`).
    pub id: u32,
    /// Worker key.
    pub key: String,
    /// The sender polls this worker's load endpoint.
    pub polled: bool,
}

/// The sender's own slot for one worker, as absolute values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotEntry {
    /// Sender-local worker id.
    pub id: u32,
    /// The sender's own counts; `dispatched_since_poll` is the work it
    /// routed since the snapshot its latest [`BasisEntry`] names.
    pub counts: LoadCounts,
}

/// The snapshot the sender's `dispatched_since_poll` for one worker counts
/// from. Only grows, so receivers keep the largest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasisEntry {
    /// Sender-local worker id.
    pub id: u32,
    /// Poll time (ms, as the sender stored it) of that snapshot.
    pub polled_at_unix_ms: u64,
}

/// A load snapshot the sender polled itself (the poller is the sender).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotEntry {
    /// Sender-local worker id.
    pub id: u32,
    /// Engine family the numbers came from.
    pub source: EngineKind,
    /// The validated signals.
    pub load: EngineLoad,
    /// Poll time, ms since the Unix epoch on the poller's clock (the LWW
    /// order, with the poller; receivers clamp it to their own clock).
    pub polled_at_unix_ms: u64,
}

/// Why a frame was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The body is larger than [`MAX_FRAME_BYTES`].
    TooLarge(usize),
    /// The body is not a valid envelope (or has trailing bytes).
    Undecodable(String),
    /// The envelope is from a wire version this build does not speak.
    UnknownVersion(u16),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLarge(n) => write!(f, "frame of {n} bytes exceeds the limit"),
            FrameError::Undecodable(e) => write!(f, "undecodable frame: {e}"),
            FrameError::UnknownVersion(v) => write!(f, "unknown frame version {v}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl FrameError {
    /// Short label for metrics (`reason` of the dropped-frames counter).
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::TooLarge(_) => "oversize",
            FrameError::Undecodable(_) => "undecodable",
            FrameError::UnknownVersion(_) => "version",
        }
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_FRAME_BYTES>()
}

/// Encodes a frame body (without the length prefix) at [`FRAME_VERSION`].
pub fn encode(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let envelope = EnvelopeRef {
        version: FRAME_VERSION,
        frame,
    };
    let body = bincode::serde::encode_to_vec(&envelope, bincode::config::standard())
        .map_err(|e| FrameError::Undecodable(e.to_string()))?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    Ok(body)
}

/// Encodes a frame with its 4-byte big-endian length prefix, ready to write.
pub fn encode_prefixed(frame: &Frame) -> Result<Vec<u8>, FrameError> {
    let body = encode(frame)?;
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a frame body (without the length prefix), refusing anything over
/// the limit, with trailing bytes, or from another wire version.
pub fn decode(body: &[u8]) -> Result<Frame, FrameError> {
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    let (envelope, used): (Envelope, usize) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| FrameError::Undecodable(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Undecodable(format!(
            "{} trailing bytes",
            body.len() - used
        )));
    }
    if envelope.version != FRAME_VERSION {
        return Err(FrameError::UnknownVersion(envelope.version));
    }
    Ok(envelope.frame)
}

/// Borrowing twin of [`Envelope`] so encoding does not clone the frame.
#[derive(Serialize)]
struct EnvelopeRef<'a> {
    version: u16,
    frame: &'a Frame,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Frame {
        Frame::Update(Update {
            round: 7,
            prev_read_at_unix_us: 1_699_999_999_980_000,
            keys: vec![KeyDef {
                id: 0,
                key: "http://w:1".into(),
                polled: true,
            }],
            slots: vec![SlotEntry {
                id: 0,
                counts: LoadCounts {
                    requests: 3,
                    tokens: 900,
                    pending_prefill: 300,
                    dispatched_since_poll: 1_345,
                },
            }],
            bases: vec![BasisEntry {
                id: 0,
                polled_at_unix_ms: 1_699_999_999_700,
            }],
            snapshots: vec![SnapshotEntry {
                id: 0,
                source: EngineKind::Sglang,
                load: EngineLoad {
                    token_usage: Some(0.25),
                    ..EngineLoad::default()
                },
                polled_at_unix_ms: 1_700_000_000_000,
            }],
        })
    }

    #[test]
    fn round_trips() {
        for frame in [
            sample(),
            Frame::Bye,
            Frame::Hello(Hello {
                cluster_id: "c".into(),
                node: "a".into(),
                generation: 1,
            }),
        ] {
            let body = encode(&frame).unwrap();
            assert_eq!(decode(&body).unwrap(), frame);
            let prefixed = encode_prefixed(&frame).unwrap();
            assert_eq!(&prefixed[4..], &body[..]);
        }
    }

    /// Known answers of wire version 2: a fixed frame of each type and its
    /// exact bytes. Two builds share load only while they agree on these,
    /// so a failure here is a protocol change: bump [`FRAME_VERSION`] (the
    /// receiver then refuses the other version, counted, instead of
    /// misreading it) and write the new vectors. Bye and Hello are checked
    /// by hand below; the Update vector pins what this build encodes.
    #[test]
    fn encodings_match_the_known_answers_of_their_version() {
        assert_eq!(FRAME_VERSION, 2, "new version: new vectors below");
        // Envelope{version: varint 2, frame: variant 2}.
        assert_eq!(encode(&Frame::Bye).unwrap(), [2, 2]);
        // Variant 0, then "c" and "a" as length-prefixed bytes, then
        // generation 300 as a varint (251 = u16 marker, then LE 300).
        let hello = Frame::Hello(Hello {
            cluster_id: "c".into(),
            node: "a".into(),
            generation: 300,
        });
        assert_eq!(
            encode(&hello).unwrap(),
            [2, 0, 1, b'c', 1, b'a', 251, 0x2c, 0x01]
        );
        assert_eq!(encode(&sample()).unwrap(), SAMPLE_UPDATE_V2);
        for (frame, bytes) in [
            (Frame::Bye, &[2u8, 2][..]),
            (sample(), &SAMPLE_UPDATE_V2[..]),
        ] {
            assert_eq!(decode(bytes).unwrap(), frame, "old bytes still decode");
        }
    }

    /// `sample()` at version 2, read field by field: version 2, variant 1
    /// (Update), round 7, the read time (253 = u64 marker, 8 LE bytes),
    /// one KeyDef {0, "http://w:1", true}, one slot {0, 3, 900, 300,
    /// 1345} (251 = u16 marker), one basis {0, time}, one snapshot {0,
    /// Sglang = 0, token_usage Some(0.25 as LE f64), four Nones, time}.
    const SAMPLE_UPDATE_V2: [u8; 74] = [
        2, 1, 7, 253, 224, 241, 29, 24, 36, 10, 6, 0, 1, 0, 10, 104, 116, 116, 112, 58, 47, 47,
        119, 58, 49, 1, 1, 0, 3, 251, 132, 3, 251, 44, 1, 251, 65, 5, 1, 0, 253, 212, 102, 229,
        207, 139, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 208, 63, 0, 0, 0, 0, 253, 0, 104, 229,
        207, 139, 1, 0, 0,
    ];

    /// The worker-set variant, appended after version 2 shipped: variant
    /// 3, then one entry {"u", hlc 5, "a", true}. Frames of the other
    /// variants keep their bytes (checked above), which is what lets a
    /// build without it keep its sessions with one that has it.
    #[test]
    fn the_worker_set_variant_is_appended_without_changing_the_others() {
        let frame = Frame::Workers(WorkerSetFrame {
            entries: vec![WorkerSetEntry {
                url: "u".into(),
                hlc_us: 5,
                origin: "a".into(),
                present: true,
            }],
        });
        let bytes = encode(&frame).unwrap();
        assert_eq!(bytes, [2, 3, 1, 1, b'u', 5, 1, b'a', 1]);
        assert_eq!(decode(&bytes).unwrap(), frame);
    }

    /// The sightings variant, appended after the worker set: variant 4,
    /// then the keys as varints. The older variants keep their bytes
    /// (checked above).
    #[test]
    fn the_sightings_variant_is_appended_after_the_worker_set() {
        let frame = Frame::Sightings(SightingsFrame { keys: vec![5, 300] });
        let bytes = encode(&frame).unwrap();
        assert_eq!(bytes, [2, 4, 2, 5, 251, 0x2c, 0x01]);
        assert_eq!(decode(&bytes).unwrap(), frame);
        let full = Frame::Sightings(SightingsFrame {
            keys: vec![u64::MAX; MAX_SIGHTINGS_PER_FRAME],
        });
        assert!(
            encode(&full).unwrap().len() < MAX_FRAME_BYTES,
            "a full frame fits"
        );
    }

    /// The worker-set digest, appended after the sightings: variant 5,
    /// then the bucket hashes as varints. The older variants keep their
    /// bytes (checked above).
    #[test]
    fn the_worker_digest_variant_is_appended_after_the_sightings() {
        let frame = Frame::WorkersDigest(WorkerDigestFrame {
            buckets: vec![0, 5, u64::MAX],
        });
        let bytes = encode(&frame).unwrap();
        assert_eq!(
            bytes,
            [2, 5, 3, 0, 5, 253, 255, 255, 255, 255, 255, 255, 255, 255]
        );
        assert_eq!(decode(&bytes).unwrap(), frame);
        let full = Frame::WorkersDigest(WorkerDigestFrame {
            buckets: vec![u64::MAX; WORKER_DIGEST_BUCKETS],
        });
        assert!(encode(&full).unwrap().len() <= 4 + 9 * WORKER_DIGEST_BUCKETS);
    }

    /// The objects variant, appended last: variant 6, then one entry
    /// {"r1", "http://w"} (lengths as varints). The older variants keep
    /// their bytes (checked above).
    #[test]
    fn the_objects_variant_is_appended_last() {
        let frame = Frame::Objects(ObjectsFrame {
            entries: vec![ObjectEntry {
                id: "r1".into(),
                worker: "http://w".into(),
            }],
        });
        let bytes = encode(&frame).unwrap();
        assert_eq!(
            bytes,
            [
                2, 6, 1, 2, b'r', b'1', 8, b'h', b't', b't', b'p', b':', b'/', b'/', b'w'
            ]
        );
        assert_eq!(decode(&bytes).unwrap(), frame);
        let full = Frame::Objects(ObjectsFrame {
            entries: vec![
                ObjectEntry {
                    id: "i".repeat(MAX_OBJECT_ID_BYTES),
                    worker: "u".repeat(MAX_KEY_BYTES),
                };
                MAX_OBJECTS_PER_FRAME
            ],
        });
        assert!(
            encode(&full).unwrap().len() < MAX_FRAME_BYTES,
            "a full frame of the longest entries fits"
        );
    }

    /// The capability and packed variants, appended after the objects:
    /// variants 7 and 8. The older variants keep their bytes (above).
    #[test]
    fn the_speaks_and_packed_variants_are_appended_last() {
        let speaks = Frame::Speaks(Speaks {
            features: Speaks::PACKED_SLOTS,
        });
        assert_eq!(encode(&speaks).unwrap(), [2, 7, 1]);
        assert_eq!(decode(&[2, 7, 1]).unwrap(), speaks);
        // Round 7, no read time, no keys, two packed bytes, no snapshots:
        // a byte vector is its length and its bytes.
        let packed = Frame::Packed(PackedUpdate {
            round: 7,
            prev_read_at_unix_us: 0,
            keys: vec![],
            slots: vec![0, 0x04],
            snapshots: vec![],
        });
        assert_eq!(encode(&packed).unwrap(), [2, 8, 7, 0, 0, 2, 0, 0x04, 0]);
        assert_eq!(decode(&[2, 8, 7, 0, 0, 2, 0, 0x04, 0]).unwrap(), packed);
    }

    #[test]
    fn rejects_other_versions_and_trailing_bytes() {
        let envelope = Envelope {
            version: FRAME_VERSION + 1,
            frame: Frame::Bye,
        };
        let body = bincode::serde::encode_to_vec(&envelope, bincode::config::standard()).unwrap();
        assert_eq!(
            decode(&body),
            Err(FrameError::UnknownVersion(FRAME_VERSION + 1))
        );
        let mut body = encode(&Frame::Bye).unwrap();
        body.push(0);
        assert!(matches!(decode(&body), Err(FrameError::Undecodable(_))));
    }

    #[test]
    fn hostile_lengths_do_not_allocate() {
        // A Vec length of 2^60 inside an otherwise tiny body must fail fast.
        let mut body = vec![1u8, 1, 7, 0, 0];
        body.extend_from_slice(&[0xFF, 0, 0, 0, 0, 0, 0, 0, 0x10]);
        assert!(decode(&body).is_err());
        assert!(decode(&[0xFF; 9]).is_err());
        assert!(decode(&[]).is_err());
    }
}
