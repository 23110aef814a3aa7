//! The facilitator HTTP server: `POST /verify`, `POST /settle`, `GET /supported`, `GET /health`
//! over any [`X402Facilitator`] (the `x402-facilitator` binary serves a [`LocalFacilitator`]).
//!
//! The routes are the transport's, written once for every scheme
//! ([`x402_transport::facilitator`], where the wire is described): a body that does not
//! decode gets `400` with `{"isValid":false,"invalidReason":"invalid_payload", ...}` (or the
//! `SettleResponse` equivalent); a settlement whose outcome is unknown gets `503` with a
//! `Retry-After` and no `success` field, so no client can mistake it for an answer.
//!
//! [`LocalFacilitator`]: crate::facilitator::LocalFacilitator

use std::sync::Arc;

use axum::Router;

use crate::facilitator::X402Facilitator;

/// The facilitator routes over `facilitator`: the transport's
/// ([`x402_transport::facilitator::router`]), the same for every scheme.
pub fn router(facilitator: Arc<dyn X402Facilitator>) -> Router {
    x402_transport::facilitator::router(facilitator)
}
