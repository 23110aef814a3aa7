//! # stripe-emulator
//!
//! A stateful emulator of the Stripe API subset the `stripe` rail (`rail-stripe`) uses: PaymentIntents (create,
//! retrieve, confirm, capture, cancel), PaymentMethods for test cards, Charges, Refunds, and
//! webhook delivery with real `Stripe-Signature` headers. A library (tests start it in process
//! with [`Emulator::spawn`]) and a binary (`stripe-emulator`).
//!
//! Shapes follow Stripe's published OpenAPI fixtures (`openapi/fixtures3.json` in
//! github.com/stripe/openapi: `payment_intent`, `charge`, `refund`, `payment_method`), with every
//! field async-stripe requires. Semantics follow Stripe's API reference:
//! - the PaymentIntent state machine (`requires_payment_method` → `requires_confirmation` →
//!   `requires_capture` (manual capture) or `succeeded`; `canceled`), declines leaving the intent
//!   in `requires_payment_method` with `last_payment_error`;
//! - capture once, `amount_to_capture` ≤ `amount_capturable`, the rest released; cancel only
//!   from the cancelable states; uncaptured authorisations lapse after 7 days (canceled,
//!   `cancellation_reason: automatic`);
//! - refunds never above what was captured minus what was refunded;
//! - idempotency: a POST with `Idempotency-Key` replays the first answer (with
//!   `Idempotent-Replayed: true`) for the same parameters, answers 400 `idempotency_error` for
//!   other parameters, and keeps keys 24 hours;
//! - secret keys (`sk_test_…`) may do everything; publishable keys (`pk_test_…`) may only
//!   retrieve and confirm an intent whose `client_secret` they present (what Stripe.js does);
//! - test payment methods: `pm_card_visa`, `pm_card_mastercard` succeed;
//!   `pm_card_chargeDeclined` (`card_declined`/`generic_decline`),
//!   `pm_card_chargeDeclinedInsufficientFunds` (`insufficient_funds`),
//!   `pm_card_chargeDeclinedFraudulent` (`fraudulent`), `pm_card_chargeDeclinedExpiredCard`
//!   (`expired_card`), `pm_card_chargeDeclinedIncorrectCvc` (`incorrect_cvc`),
//!   `pm_card_chargeDeclinedProcessingError` (`processing_error`). Cards with a credit limit
//!   (emulator-only `POST /_emulator/cards`) decline with `insufficient_funds` beyond it.
//!
//! Emulator-only routes live under `/_emulator/` (cards with limits, the clock, balances).
//!
//! Layout: `state` holds the state machine (intents, charges, refunds, cards, idempotency
//! keys, authorisation lapse, events; no HTTP), `http` the surface (authentication, routes,
//! form decoding, webhook delivery, response headers), `error` Stripe's error answers, which
//! both produce.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use stripe_emulator::{Emulator, EmulatorConfig};
//! let stripe = Emulator::spawn(EmulatorConfig::default(), "127.0.0.1:0".parse().unwrap()).await?;
//! assert!(stripe.url.starts_with("http://127.0.0.1:"));
//! assert_eq!(stripe.emulator.balance("usd"), 0);
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rail_core::{ManualClock, SharedClock};

use state::StateInner;

mod error;
mod http;
mod state;

/// How long idempotency keys are kept.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long an uncaptured card authorisation lasts.
pub const AUTHORIZATION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// The smallest charge in USD cents (Stripe's minimum charge amount: $0.50).
pub const MIN_CHARGE_USD: u64 = 50;

/// How an emulator starts.
#[derive(Clone)]
pub struct EmulatorConfig {
    /// The secret key (`sk_test_…`).
    pub secret_key: String,
    /// The publishable key (`pk_test_…`).
    pub publishable_key: String,
    /// Where to deliver webhooks, and the endpoint's signing secret (`whsec_…`).
    pub webhook: Option<(String, String)>,
    /// The clock (a [`ManualClock`] lets tests make authorisations lapse).
    pub clock: SharedClock,
}

impl std::fmt::Debug for EmulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatorConfig")
            .field("secret_key", &"<redacted>")
            .field("publishable_key", &self.publishable_key)
            .field("webhook", &self.webhook.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            secret_key: "sk_test_emulator".into(),
            publishable_key: "pk_test_emulator".into(),
            webhook: None,
            clock: Arc::new(rail_core::SystemClock),
        }
    }
}

/// The emulator. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Emulator {
    cfg: Arc<EmulatorConfig>,
    state: Arc<Mutex<StateInner>>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// An emulator with no state.
    #[must_use]
    pub fn new(cfg: EmulatorConfig) -> Self {
        // One rustls provider for the workspace (ring), installed before any client is built.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Emulator {
            cfg: Arc::new(cfg),
            state: Arc::new(Mutex::new(StateInner::default())),
            http: reqwest::Client::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, StateInner> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> i64 {
        self.cfg.clock.now().unix_seconds()
    }
}

/// An emulator serving HTTP; stops when dropped.
#[derive(Debug)]
pub struct RunningEmulator {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The state behind it.
    pub emulator: Emulator,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RunningEmulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A test clock for emulators in tests.
#[must_use]
pub fn manual_clock() -> (ManualClock, SharedClock) {
    let c = ManualClock::starting_now();
    (c.clone(), Arc::new(c))
}
