//! The creating answer's body, passed through while its first bytes are
//! scanned for the new object's id.
//!
//! Why a wrapper only on creator routes: every other answer's body goes
//! out unwrapped, so they pay nothing; here each data frame is handed on
//! unchanged and at once, and the scanner reads at most
//! [`SCAN_LIMIT`](super::SCAN_LIMIT) bytes of it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{IdScanner, ObjectTable};

/// `inner`, with the id it carries recorded as held by `worker`.
pub struct LearnId<B> {
    inner: B,
    scanner: IdScanner,
    table: Arc<ObjectTable>,
    worker: Arc<str>,
}

impl<B> LearnId<B> {
    /// Wraps the body `worker` answered with.
    pub fn new(inner: B, table: Arc<ObjectTable>, worker: &str) -> Self {
        Self {
            inner,
            scanner: IdScanner::default(),
            table,
            worker: Arc::from(worker),
        }
    }
}

impl<B> Body for LearnId<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && !this.scanner.is_done()
            && let Some(data) = frame.data_ref()
            && let Some(id) = this.scanner.feed(data)
        {
            this.table.learn(&id, &this.worker);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    #[tokio::test]
    async fn frames_pass_unchanged_and_the_id_is_learned() {
        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
            ["{\"id\":\"re", "sp_42\",\"object\":\"response\"}"]
                .into_iter()
                .map(|s| Ok(Frame::data(Bytes::from_static(s.as_bytes()))))
                .collect();
        let body = StreamBody::new(futures_util::stream::iter(frames));
        let table = Arc::new(ObjectTable::new(8));
        let learned = LearnId::new(body, table.clone(), "http://w1");
        let bytes = learned.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"{\"id\":\"resp_42\",\"object\":\"response\"}");
        assert_eq!(table.holder("resp_42").as_deref(), Some("http://w1"));
    }
}
