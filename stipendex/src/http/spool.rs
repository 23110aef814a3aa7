//! A paid answer's body, read whole before its Receipt is signed — the Receipt binds the
//! body's digest, and its header goes out before the body — without holding a large body in
//! memory: up to [`IN_MEMORY`] bytes it stays in memory (and can be kept for a repeat of the
//! payment), past that it goes to an anonymous temporary file (removed when dropped), hashed as
//! it arrives. Nothing a receiver's work answers is too large to be delivered and receipted,
//! up to the binding's [`super::Binding::max_answer`].

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};

use crate::envelope::Digest;
use crate::receiver::MAX_KEPT_ANSWER;

/// How much of a body is held in memory before it goes to a temporary file: the most a
/// receiver keeps for a repeat of a payment ([`MAX_KEPT_ANSWER`]).
pub(crate) const IN_MEMORY: usize = MAX_KEPT_ANSWER;

/// The largest paid answer a binding delivers by default (1 GiB): past it the payment is given
/// back ([`super::Binding::max_answer`]).
pub const DEFAULT_MAX_ANSWER: u64 = 1024 * 1024 * 1024;

/// A body read whole, with its digest.
pub(crate) struct Spooled {
    pub(crate) digest: Digest,
    data: Data,
}

enum Data {
    Memory(Bytes),
    File(tokio::fs::File),
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub(crate) enum SpoolError {
    /// Longer than allowed.
    TooLarge(u64),
    /// The body's stream or the temporary file failed.
    Io(String),
}

impl std::fmt::Display for SpoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpoolError::TooLarge(max) => write!(f, "the answer is over {max} bytes"),
            SpoolError::Io(e) => write!(f, "the answer cannot be read: {e}"),
        }
    }
}

/// Reads `body` whole (at most `max` bytes), hashing it as it arrives.
pub(crate) async fn read(body: Body, max: u64) -> Result<Spooled, SpoolError> {
    let io = |e: std::io::Error| SpoolError::Io(e.to_string());
    let mut stream = body.into_data_stream();
    let mut hash = Sha256::new();
    let mut len: u64 = 0;
    let mut memory: Vec<u8> = Vec::new();
    let mut file: Option<tokio::fs::File> = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| SpoolError::Io(e.to_string()))?;
        len = len.saturating_add(chunk.len() as u64);
        if len > max {
            return Err(SpoolError::TooLarge(max));
        }
        hash.update(&chunk);
        match &mut file {
            Some(f) => f.write_all(&chunk).await.map_err(io)?,
            None if memory.len() + chunk.len() <= IN_MEMORY => memory.extend_from_slice(&chunk),
            None => {
                let std_file = tokio::task::spawn_blocking(tempfile::tempfile)
                    .await
                    .map_err(|e| SpoolError::Io(e.to_string()))?
                    .map_err(io)?;
                let mut f = tokio::fs::File::from_std(std_file);
                f.write_all(&memory).await.map_err(io)?;
                f.write_all(&chunk).await.map_err(io)?;
                memory = Vec::new();
                file = Some(f);
            }
        }
    }
    let digest = Digest::from_sha256(hash.finalize().into());
    let data = match file {
        None => Data::Memory(Bytes::from(memory)),
        Some(mut f) => {
            f.flush().await.map_err(io)?;
            f.rewind().await.map_err(io)?;
            Data::File(f)
        }
    };
    Ok(Spooled { digest, data })
}

impl Spooled {
    /// The body, if it is held in memory (at most [`IN_MEMORY`] bytes: small enough to keep).
    pub(crate) fn in_memory(&self) -> Option<&Bytes> {
        match &self.data {
            Data::Memory(b) => Some(b),
            Data::File(_) => None,
        }
    }

    /// The body to send: from memory, or streamed from the temporary file (removed once sent).
    pub(crate) fn into_body(self) -> Body {
        match self.data {
            Data::Memory(b) => Body::from(b),
            Data::File(f) => Body::from_stream(futures::stream::unfold(Some(f), |f| async move {
                let mut f = f?;
                let mut buf = vec![0u8; 64 * 1024];
                match f.read(&mut buf).await {
                    Ok(0) => None,
                    Ok(n) => {
                        buf.truncate(n);
                        Some((Ok::<_, std::io::Error>(Bytes::from(buf)), Some(f)))
                    }
                    Err(e) => Some((Err(e), None)),
                }
            })),
        }
    }
}
