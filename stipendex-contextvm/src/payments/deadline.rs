//! [`Deadline`]: when a payment stops being waited for. Used by the server's middleware
//! ([`super::server`]) and by the payment limits ([`super::limits`]) that withdraw it.

use tokio::sync::watch;
use tokio::time::Instant;

/// When a payment stops being waited for: its deadline, or earlier when the server withdraws
/// its payment request (the client asked for the same invocation again, or the server was full
/// and this was the oldest unpaid payment of the client with the most).
///
/// A [`Processor`](super::server::Processor) stops *waiting* at it, never *accepting*: a payment already seen when it is
/// withdrawn is still checked and accepted, and its request served.
#[derive(Clone, Debug)]
pub struct Deadline {
    at: Instant,
    released: Option<watch::Receiver<bool>>,
}

impl Deadline {
    /// A deadline at `at` that is never withdrawn.
    #[must_use]
    pub fn at(at: Instant) -> Self {
        Deadline { at, released: None }
    }

    pub(crate) fn new(at: Instant, released: watch::Receiver<bool>) -> Self {
        Deadline {
            at,
            released: Some(released),
        }
    }

    /// The same withdrawal, at another time.
    #[must_use]
    pub(crate) fn until(&self, at: Instant) -> Self {
        Deadline {
            at,
            released: self.released.clone(),
        }
    }

    /// The time it ends at.
    #[must_use]
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Whether the payment request was withdrawn.
    #[must_use]
    pub fn released(&self) -> bool {
        self.released.as_ref().is_some_and(|r| *r.borrow())
    }

    /// Whether it ended: its time passed, or it was withdrawn.
    #[must_use]
    pub fn passed(&self) -> bool {
        Instant::now() >= self.at || self.released()
    }

    /// Resolves when the payment request is withdrawn (never, if it is not).
    pub async fn withdrawn(&self) {
        if let Some(r) = &self.released {
            let mut r = r.clone();
            if r.wait_for(|v| *v).await.is_ok() {
                return;
            }
        }
        std::future::pending::<()>().await;
    }

    /// Resolves when it ends: its time, or its withdrawal.
    pub async fn reached(&self) {
        tokio::select! {
            () = tokio::time::sleep_until(self.at) => {}
            () = self.withdrawn() => {}
        }
    }
}
