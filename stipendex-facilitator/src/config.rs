//! The facilitator's settings.

use std::time::Duration;

/// How a facilitator instance behaves. Every instance on one database must agree on
/// `network`; the rest may differ per instance.
#[derive(Clone, Debug)]
pub struct Config {
    /// The facilitator's network name: offers carry it, and a payment for another
    /// facilitator's offer is refused (`wrong_network`).
    pub network: String,
    /// This instance's name (logs, metrics, health).
    pub instance: String,
    /// How far a signed request's time may be from this instance's clock, either way; nonces
    /// are remembered three times as long (a request a window ahead, on an instance a window
    /// behind).
    pub window: Duration,
    /// How long a payment waiting for review holds the payer's funds before it lapses (never
    /// longer than its offer lives; a hold's review undecided at its offer's end is released
    /// then, by the sweep or the next reader).
    pub review_hold: Duration,
    /// How much of its offer's life a payment must have left to be approved: the payer still
    /// has to present it and the receiver to verify it before the offer expires. Approving
    /// later would pay for an offer the receiver can no longer accept; it is refused and the
    /// funds are released.
    pub approval_margin: Duration,
    /// The longest hold a payer may be asked for.
    pub max_hold: Duration,
    /// How long an account's key and settings are cached by an instance (a disabled account
    /// or a new key takes effect within this time).
    pub account_cache: Duration,
    /// The largest request body accepted.
    pub max_body: usize,
}

impl Config {
    /// Defaults for the facilitator named `network`: a 5-minute replay window, reviews held
    /// 24 h, holds up to 6 h, accounts cached 5 s, bodies up to 64 KiB.
    #[must_use]
    pub fn new(network: &str) -> Self {
        Config {
            network: network.to_owned(),
            instance: format!("fac-{}", hex::encode(rand::random::<[u8; 3]>())),
            window: rail_account::auth::DEFAULT_WINDOW,
            review_hold: Duration::from_secs(24 * 3600),
            approval_margin: Duration::from_secs(60),
            max_hold: rail_ledger::DEFAULT_MAX_HOLD,
            account_cache: Duration::from_secs(5),
            max_body: 64 * 1024,
        }
    }

    /// Names this instance.
    #[must_use]
    pub fn with_instance(mut self, name: &str) -> Self {
        name.clone_into(&mut self.instance);
        self
    }
}
