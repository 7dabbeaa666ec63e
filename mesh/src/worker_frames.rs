//! The worker set on the wire: entries as frames split by size, and the
//! digest. The outbox sends this node's own writes with every round, the
//! whole set to a new link and the digest every anti-entropy interval; a
//! session answers a peer's digest with the entries of the buckets that
//! differ (see `worker_set` for why that is enough).

use shoal_proto::frame_size::chunks_by_size;
use shoal_proto::frames::{
    Frame, FrameError, WorkerDigestFrame, WorkerSetEntry, WorkerSetFrame, encode_prefixed,
};

/// Encoded worker-set frames and their bytes (for the byte counter).
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    pub(crate) frames: Vec<Vec<u8>>,
    pub(crate) bytes: usize,
}

impl Encoded {
    fn push(&mut self, frame: Vec<u8>) {
        self.bytes += frame.len();
        self.frames.push(frame);
    }

    /// Adds `other`'s frames after these.
    pub(crate) fn extend(&mut self, other: Encoded) {
        self.bytes += other.bytes;
        self.frames.extend(other.frames);
    }
}

/// `entries` as `Workers` frames, each well under the frame limit.
pub(crate) fn entries(entries: &[WorkerSetEntry]) -> Result<Encoded, FrameError> {
    let mut out = Encoded::default();
    for chunk in chunks_by_size(entries) {
        out.push(encode_prefixed(&Frame::Workers(WorkerSetFrame {
            entries: chunk.to_vec(),
        }))?);
    }
    Ok(out)
}

/// The digest `buckets` as a frame.
pub(crate) fn digest(buckets: Vec<u64>) -> Result<Encoded, FrameError> {
    let mut out = Encoded::default();
    out.push(encode_prefixed(&Frame::WorkersDigest(WorkerDigestFrame {
        buckets,
    }))?);
    Ok(out)
}
