//! Batching of stream messages: a [`Batched`] stream yields, each time it is polled
//! with items ready, every item queued at that moment (up to [`MAX_BATCH`]) as one
//! message. An idle call goes out alone and at once; under load, one HTTP/2 frame
//! and one write carry many calls or replies.

use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::Stream;

/// Most items in one batch (bounds a message's size and a receiver's latency).
pub const MAX_BATCH: usize = 512;

/// Turns a channel of items into a stream of batches, built by `wrap`.
pub struct Batched<T, F> {
    rx: UnboundedReceiver<T>,
    wrap: F,
}

impl<T, B, F: FnMut(Vec<T>) -> B> Batched<T, F> {
    /// Batches what `rx` receives.
    pub fn new(rx: UnboundedReceiver<T>, wrap: F) -> Self {
        Batched { rx, wrap }
    }
}

impl<T, B, F: FnMut(Vec<T>) -> B + Unpin> Stream for Batched<T, F> {
    type Item = B;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<B>> {
        let this = self.get_mut();
        let mut items = Vec::new();
        match this.rx.poll_recv_many(cx, &mut items, MAX_BATCH) {
            Poll::Ready(0) => Poll::Ready(None),
            Poll::Ready(_) => Poll::Ready(Some((this.wrap)(items))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn queued_items_leave_as_one_batch_and_the_stream_ends_with_the_channel() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        drop(tx);
        let mut s = Batched::new(rx, |v: Vec<i32>| v);
        assert_eq!(s.next().await, Some(vec![0, 1, 2, 3, 4]));
        assert_eq!(s.next().await, None);
    }
}
