//! The served-once record of a payment, shared by the HTTP paywall and the MCP adapter (one
//! payment is served once across both), and by the rail's receiver: reserved while it settles,
//! `paid:<tx>` (held, its lease kept alive) while the content is produced, committed once served.

use rail_core::keys::Reservation;

pub use x402_transport::served::{SERVE_WINDOW, SERVED_RETENTION};

pub(crate) use crate::scheme::served_key;

/// Frees a served-once reservation (the payment may be presented again).
pub(crate) async fn release(r: Reservation) {
    if let Err(e) = r.release().await {
        tracing::warn!(error = %e, "x402: could not release a serve reservation");
    }
}

/// The served-once record's states beyond rail-core's `reserved` / `committed`.
#[cfg(feature = "mcp")]
const PAID: &str = "paid";
#[cfg(feature = "mcp")]
pub(crate) const RUNNING: &str = "running";

#[cfg(feature = "mcp")]
/// Whether another request is processing this payment right now (then: 503, retry the same
/// payment), rather than having used it.
pub(crate) async fn in_flight(
    served: &rail_core::ReplayGuard,
    key: &str,
) -> Result<bool, rail_core::RailError> {
    Ok(matches!(
        served.state(key).await?.as_deref(),
        Some(rail_core::keys::RESERVED | RUNNING)
    ))
}

#[cfg(feature = "mcp")]
/// Records a settled payment before its content is produced: the record stays held (its lease
/// kept alive while the handler or tool runs), and a copy presented meanwhile is refused as used.
/// `false` when the record is no longer this request's (another request took it over, and will
/// answer the payer): then this one must not produce the content.
pub(crate) async fn mark_paid(
    serving: &Reservation,
    settled: &crate::wire::SettleResponse,
) -> bool {
    match serving
        .advance(&format!("{PAID}:{}", settled.transaction), None)
        .await
    {
        Ok(()) => true,
        Err(rail_core::RailError::Replayed { .. }) => {
            tracing::warn!(tx = %settled.transaction, "x402: paid, but another request holds the payment's record; not serving twice");
            false
        }
        // The store failed: the charge happened, so the payer is served.
        Err(e) => {
            tracing::warn!(error = %e, tx = %settled.transaction, "x402: paid, but could not record it");
            true
        }
    }
}
