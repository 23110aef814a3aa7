//! [`Idempotent`]: one payment per operation id, for any payer.

use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::error::{RailError, RailReason, RailResult};
use crate::keys::{Attempt, Idempotency, KeyStore};
use crate::rail::{Capabilities, HoldPayer, Payer, Rail};
use crate::types::{Offer, OpId, Payment, PaymentMode, RailId};

/// How a payer finds what an earlier, unfinished attempt of an operation did on its rail.
///
/// Called by [`Idempotent`] when an attempt of `op` started and never recorded its result (its
/// process died, or its outcome was unknown). Contract:
/// - `Ok(Some(payment))`: the earlier attempt paid; this is its payment.
/// - `Ok(None)`: nothing moved for certain; paying now is safe. A rail that makes the operation
///   itself idempotent (a ledger transfer id, a Stripe `Idempotency-Key` derived from `op`) may
///   answer `None`: paying again *is* the look-up.
/// - `Err(e)` with `e.is_retryable()`: cannot tell yet; the operation stays held for the next
///   attempt to recover.
#[async_trait]
pub trait FindPayment: Send + Sync {
    /// What the earlier attempt of `op` for `offer` (in `mode`) did.
    async fn find_payment(
        &self,
        op: &OpId,
        offer: &Offer,
        mode: PaymentMode,
    ) -> RailResult<Option<Payment>>;

    /// Whether paying again under the same operation id can never move money twice (the rail
    /// answers the earlier payment, or refuses the repeat): then [`Idempotent`]'s records
    /// guard no money, and are written through its store's deferred handle
    /// ([`crate::KeyStore::deferred`]), which a power loss may undo; the rail answers the
    /// repeat that follows. `false` (the default): its claim is durable before the rail is
    /// asked. [`crate::glue::NothingToFind`] payers answer `true`.
    fn repeat_is_safe(&self) -> bool {
        false
    }
}

/// A payer that pays at most once per operation id: the same `op` with the same offer returns
/// the first payment (from the store, shared by every process using it); the same `op` with
/// another offer is an idempotency conflict; the same `op` while the first call runs is
/// "in progress" (retryable).
///
/// Concurrent calls with one operation id in this process wait for the first and get its
/// payment (they queue on a per-operation lock); a call in another process sharing the store
/// gets [`crate::RailError::InProgress`] (retryable) while the first runs.
#[derive(Debug)]
pub struct Idempotent<P> {
    inner: P,
    idem: Idempotency,
    /// Striped per-operation locks: calls with one operation id queue on one of them.
    ops: Box<[tokio::sync::Mutex<()>]>,
}

const STRIPES: usize = 64;

/// The lease of a payment in flight, renewed every third of it while the rail is asked: short,
/// so that a payment left by a process that ended is taken over within seconds (the wallet
/// waits for it rather than paying beside it), never while its holder lives.
pub(crate) const PAYER_LEASE: std::time::Duration = std::time::Duration::from_secs(6);

/// How long a finished payment's result is remembered for the same operation (Stripe's window).
const PAYER_RETAIN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl<P: Rail + FindPayment> Idempotent<P> {
    /// Wraps `inner`, keeping its operations in `store` under `<rail>/payer`: durable before
    /// the rail is asked, or, for a payer whose repeat is safe ([`FindPayment::repeat_is_safe`]),
    /// through the store's deferred handle (no `fsync` of their own).
    pub fn new(inner: P, store: Arc<dyn KeyStore>) -> Self {
        let ns = format!("{}/payer", inner.id());
        let store = if inner.repeat_is_safe() {
            crate::keys::deferred(&store)
        } else {
            store
        };
        Idempotent {
            inner,
            idem: Idempotency::new(store, ns).with_windows(PAYER_LEASE, PAYER_RETAIN),
            ops: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl<P> Idempotent<P> {
    /// The wrapped payer.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: Rail> Rail for Idempotent<P> {
    fn id(&self) -> RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

impl<P: FindPayment> Idempotent<P> {
    async fn once<F, Fut>(
        &self,
        op: &OpId,
        offer: &Offer,
        mode: PaymentMode,
        act: F,
    ) -> RailResult<Payment>
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = RailResult<Payment>> + Send,
    {
        let digest = Sha256::digest(op.as_str().as_bytes());
        let stripe = usize::from(digest.first().copied().unwrap_or_default()) % STRIPES;
        let _queued = match self.ops.get(stripe) {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        self.idem
            .run(op, offer, |attempt| async move {
                if attempt == Attempt::Recovering {
                    match self.inner.find_payment(op, offer, mode).await {
                        Ok(Some(found)) => return Ok(found),
                        Ok(None) => {}
                        Err(e) if e.is_retryable() => return Err(e),
                        // Cannot tell what the earlier attempt did: the operation stays held for
                        // the next attempt (stuck beats paying twice).
                        Err(e) => {
                            return Err(RailError::Unavailable(RailReason::new(
                                "recovery",
                                format!("cannot tell what an earlier attempt did: {e}"),
                            )));
                        }
                    }
                }
                act().await
            })
            .await
    }
}

#[async_trait]
impl<P: Payer + FindPayment> Payer for Idempotent<P> {
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.once(op, offer, PaymentMode::Capture, || {
            self.inner.pay(op, offer)
        })
        .await
    }

    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        self.inner.accepts(offer)
    }
}

#[async_trait]
impl<P: HoldPayer + FindPayment> HoldPayer for Idempotent<P> {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.once(op, offer, PaymentMode::Hold, || self.inner.hold(op, offer))
            .await
    }
}
