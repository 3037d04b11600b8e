//! Fetching one object into the store: received bytes stream through a bounded buffer into an
//! [`ObjectWriter`] (a temp file, hashed as it is written), which is sealed as a
//! [`Staged`](crate::store::Staged) object and published only when its length and SHA-256 are
//! the reference's (distribution.md §2). `tensorfs download` and the lazy mount both fetch
//! through here.
//!
//! A copy whose digest is wrong (a byte changed on the way) is removed and asked for again,
//! until the origin's [`Origin::retry_deadline`] (an HTTP client's deadline) has passed since the
//! first wrong copy; an origin that keeps sending other bytes fails then, having admitted
//! nothing. Transport failures are the origin's to retry ([`Origin::fetch`]).

use std::io::Write;
use std::time::Instant;

use super::origin::Origin;
use super::origin::{FetchError, Sink};
use crate::format::ObjectRef;
use crate::store::{ObjectWriter, Store, StoreError};

/// Bytes gathered before one write to the object's temp file: what a transfer holds in memory.
pub const SINK_BUFFER_BYTES: usize = 1 << 20;

/// Why an object was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// The endpoint refused, failed or lacks it, or the deadline passed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The local store failed (temp file, flush, rename).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every copy received was other bytes than the object's.
    #[error(
        "GET {}: {copies} copies received were not its bytes (the last was {found}); nothing was admitted",
        .object.id()
    )]
    Mismatch {
        /// The object asked for.
        object: ObjectRef,
        /// Copies received.
        copies: u32,
        /// What the last copy was.
        found: ObjectRef,
    },
}

/// Received bytes on their way into a writer, gathered in a buffer written in pieces (blocking
/// in place, so the runtime must be multi-threaded).
struct StoreSink {
    writer: ObjectWriter,
    buffer: Vec<u8>,
}

impl StoreSink {
    fn flush(&mut self) -> std::io::Result<()> {
        let (writer, buffer) = (&mut self.writer, &mut self.buffer);
        tokio::task::block_in_place(|| writer.write_all(buffer))?;
        buffer.clear();
        Ok(())
    }
}

impl Sink for StoreSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= SINK_BUFFER_BYTES {
            self.flush()?;
        }
        Ok(())
    }
}

/// Fetches `object` from `endpoint` and admits it into `store`; `progress` hears of every byte
/// received (a copy asked for again is heard again). Runs on a multi-threaded tokio runtime.
///
/// # Errors
/// See [`AdmitError`]; nothing is admitted on failure, and the temp file is removed.
pub async fn admit(
    store: &Store,
    endpoint: &dyn Origin,
    object: &ObjectRef,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<(), AdmitError> {
    let mut copies = 0u32;
    let mut first_wrong: Option<Instant> = None;
    loop {
        let mut sink = StoreSink {
            writer: store.writer()?,
            buffer: Vec::with_capacity(SINK_BUFFER_BYTES.min(object.length as usize)),
        };
        endpoint.fetch(object, &mut sink, progress).await?;
        sink.flush().map_err(|source| FetchError::Sink {
            what: format!("GET {}", object.id()),
            source,
        })?;
        let staged = tokio::task::block_in_place(|| sink.writer.finish_staged())?;
        if staged.object() == object {
            tokio::task::block_in_place(|| staged.publish())?;
            return Ok(());
        }
        copies += 1;
        let found = *staged.object();
        // Dropping the staged copy removes it.
        drop(staged);
        let since = *first_wrong.get_or_insert_with(Instant::now);
        let left = endpoint.retry_deadline().saturating_sub(since.elapsed());
        if left.is_zero() {
            return Err(AdmitError::Mismatch {
                object: *object,
                copies,
                found,
            });
        }
        tracing::debug!(
            "GET {} from {}: received {found}, not its bytes; asking again",
            object.id(),
            endpoint.url()
        );
        tokio::time::sleep(endpoint.retry_wait(copies).min(left)).await;
    }
}
