//! Length-prefixed frames on QUIC streams.

use quinn::{RecvStream, SendStream};
use shoal_proto::frames::{self, Frame, FrameError, MAX_FRAME_BYTES};

/// What reading one frame produced.
#[derive(Debug)]
pub(crate) enum Read {
    /// A decoded frame and its size on the wire.
    Frame(Frame, usize),
    /// A frame that failed to decode; the stream is still in sync.
    Bad(FrameError),
    /// The peer finished the stream cleanly.
    End,
}

/// Why a stream can no longer be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StreamError {
    /// The length prefix exceeds the limit: framing is lost.
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The stream or connection failed.
    #[error("read: {0}")]
    Read(#[from] quinn::ReadExactError),
    /// Writing failed.
    #[error("write: {0}")]
    Write(#[from] quinn::WriteError),
    /// A frame could not be encoded (a bug, or an absurdly large update).
    #[error("encode: {0}")]
    Encode(#[from] FrameError),
}

/// Reads one length-prefixed frame. Never allocates more than the limit.
pub(crate) async fn read_frame(recv: &mut RecvStream) -> Result<Read, StreamError> {
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(Read::End),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(StreamError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(match frames::decode(&body) {
        Ok(frame) => Read::Frame(frame, len + 4),
        Err(e) => Read::Bad(e),
    })
}

/// Writes one frame with its length prefix; returns the bytes written.
pub(crate) async fn write_frame(
    send: &mut SendStream,
    frame: &Frame,
) -> Result<usize, StreamError> {
    let bytes = frames::encode_prefixed(frame)?;
    send.write_all(&bytes).await?;
    Ok(bytes.len())
}
