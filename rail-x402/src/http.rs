//! The shared x402 paywall ([`x402_transport::paywall`]) priced in one EVM token: the short way
//! to put USDC prices on axum routes. Every rule of the paywall (settle before or after the
//! handler, served once across instances, `HEAD` free, 402 / 503 answers, v1 opt-in) is the
//! transport's; this module only builds it with one [`ExactEvm`] scheme.
//!
//! To accept other schemes on the same routes (the seed's exact-algo, say), build the
//! transport's paywall with [`ExactEvm`] and the other schemes directly ([`crate::scheme`]).
//!
//! ```no_run
//! # async fn demo(facilitator: std::sync::Arc<dyn rail_x402::facilitator::X402Facilitator>) {
//! use axum::{Router, routing::get};
//! use rail_x402::http::{Paywall, Token};
//!
//! let usdc = Token::new("eip155:84532", "0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse().unwrap(), "USDC", "2");
//! let paywall = Paywall::new(facilitator, usdc, "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".parse().unwrap())
//!     .route("/weather", 1_000u64, "Today's weather"); // 0.001 USDC
//! let app: Router = paywall.apply(Router::new().route("/weather", get(|| async { "sunny" })));
//! # }
//! ```

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::http::HeaderName;
use rail_core::keys::KeyStore;
use rail_core::{SharedClock, SystemClock};
use x402_transport::Accepts;

use crate::facilitator::X402Facilitator;
use crate::scheme::ExactEvm;
use crate::wire::{PaymentRequired, PaymentRequirements};

pub use crate::token::Token;
pub use crate::wire::PAYMENT_REQUIRED_ERROR;
pub use x402_transport::SettleWhen;
pub use x402_transport::served::{SERVE_WINDOW, SERVED_RETENTION};

/// `PAYMENT-REQUIRED` (lower case, as HTTP/2 sends it).
pub const PAYMENT_REQUIRED: HeaderName = HeaderName::from_static("payment-required");
/// `PAYMENT-SIGNATURE`.
pub const PAYMENT_SIGNATURE: HeaderName = HeaderName::from_static("payment-signature");
/// `PAYMENT-RESPONSE`.
pub const PAYMENT_RESPONSE: HeaderName = HeaderName::from_static("payment-response");
/// `X-PAYMENT` (v1).
pub const X_PAYMENT: HeaderName = HeaderName::from_static("x-payment");
/// `X-PAYMENT-RESPONSE` (v1).
pub const X_PAYMENT_RESPONSE: HeaderName = HeaderName::from_static("x-payment-response");
/// `Retry-After` of a 503, seconds.
pub const RETRY_AFTER_SECS: u64 = x402_transport::wire::RETRY_AFTER_SECS;

/// Routes priced in one token, settled by one facilitator. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Paywall {
    scheme: ExactEvm,
    routes: Vec<(String, u128, String)>,
    store: Option<Arc<dyn KeyStore>>,
    clock: SharedClock,
    settle_when: SettleWhen,
}

impl Paywall {
    /// A paywall paying `pay_to` in `token`, settling through `facilitator`, remembering
    /// served payments in memory (use [`Paywall::with_store`] to share them).
    #[must_use]
    pub fn new(facilitator: Arc<dyn X402Facilitator>, token: Token, pay_to: Address) -> Self {
        Self {
            scheme: ExactEvm::new(facilitator, token, pay_to),
            routes: Vec::new(),
            store: None,
            clock: Arc::new(SystemClock),
            settle_when: SettleWhen::Before,
        }
    }

    /// Judges payments' validity windows by `clock` instead of the host's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Also accepts x402 **v1** clients ([`ExactEvm::accept_v1`]): the 402's JSON body becomes
    /// v1's, and `X-PAYMENT` is accepted and answered with `X-PAYMENT-RESPONSE`.
    ///
    /// # Errors
    /// A message when the chain has no v1 name.
    pub fn accept_v1(mut self, name: Option<&str>) -> Result<Self, String> {
        self.scheme = self.scheme.accept_v1(name)?;
        Ok(self)
    }

    /// Served payments kept in `store` (PostgreSQL for several instances).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// When to settle (default [`SettleWhen::Before`]).
    #[must_use]
    pub const fn settle(mut self, when: SettleWhen) -> Self {
        self.settle_when = when;
        self
    }

    /// `maxTimeoutSeconds` of every route (default 60).
    #[must_use]
    pub fn max_timeout_seconds(mut self, secs: u64) -> Self {
        self.scheme = self.scheme.max_timeout_seconds(secs);
        self
    }

    /// Prices `pattern` (axum-style, matched on the percent-decoded path) at `amount` atomic
    /// units of the token. The first matching route wins.
    ///
    /// # Panics
    /// If `amount` is zero (a price of nothing is a configuration error, reported where the
    /// route is declared).
    #[must_use]
    pub fn route(mut self, pattern: &str, amount: impl Into<u128>, description: &str) -> Self {
        let amount = amount.into();
        assert!(
            amount > 0,
            "x402 paywall: the route {pattern} is priced at zero"
        );
        self.routes
            .push((pattern.to_owned(), amount, description.to_owned()));
        self
    }

    /// The scheme.
    #[must_use]
    pub fn scheme(&self) -> &ExactEvm {
        &self.scheme
    }

    /// The facilitator.
    #[must_use]
    pub fn facilitator(&self) -> &Arc<dyn X402Facilitator> {
        self.scheme.facilitator()
    }

    /// The requirements and description of a request path, `None` if it is free.
    #[must_use]
    pub fn requirements_for(&self, path: &str) -> Option<(PaymentRequirements, String)> {
        let (_, amount, description) = self
            .routes
            .iter()
            .find(|(p, _, _)| rail_core::route::RoutePattern::parse(p).matches_path(path))?;
        Some((
            self.scheme.requirements_for(U256::from(*amount)),
            description.clone(),
        ))
    }

    /// The transport's paywall these routes make.
    #[must_use]
    pub fn transport(&self) -> x402_transport::paywall::Paywall {
        let scheme: Arc<dyn x402_transport::Scheme> = Arc::new(self.scheme.clone());
        let mut p = x402_transport::paywall::Paywall::new()
            .with_clock(self.clock.clone())
            .settle(self.settle_when);
        if let Some(store) = &self.store {
            p = p.with_store(store.clone());
        }
        for (pattern, amount, description) in &self.routes {
            let accepts = Accepts::default().or_priced(scheme.clone(), *amount);
            p = p.route(pattern, description, accepts);
        }
        p
    }

    /// Puts the paywall in front of every route of `router` (apply it to the top-level
    /// router: prices are matched on the full request path).
    pub fn apply<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        self.transport().apply(router)
    }
}

/// The v1 402 body for `pr` on v1 network `name` (`maxAmountRequired`, inline resource).
#[must_use]
pub fn v1_body(pr: &PaymentRequired, name: &str) -> crate::v1::PaymentRequiredV1 {
    let resource = pr.resource.as_ref();
    crate::v1::PaymentRequiredV1 {
        x402_version: crate::v1::V1::default(),
        error: pr.error.clone(),
        accepts: pr
            .accepts
            .iter()
            .map(|r| crate::v1::PaymentRequirementsV1 {
                scheme: r.scheme.clone(),
                network: name.to_owned(),
                max_amount_required: r.amount,
                resource: resource.map(|r| r.url.clone()).unwrap_or_default(),
                description: resource
                    .and_then(|r| r.description.clone())
                    .unwrap_or_default(),
                mime_type: resource.and_then(|r| r.mime_type.clone()),
                output_schema: None,
                pay_to: r.pay_to.clone(),
                max_timeout_seconds: r.max_timeout_seconds,
                asset: r.asset.clone(),
                extra: r.extra.clone(),
            })
            .collect(),
    }
}
