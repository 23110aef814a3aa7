//! What a receiver publishes agrees with itself: the `maxTimeoutSeconds` of the x402
//! challenge ([`ExactEvm`]) and of the requirements inside a Quote's x402 offer
//! ([`X402Receiver`]) are one constant, [`DEFAULT_MAX_TIMEOUT_SECONDS`], whatever the Quote's
//! own lifetime.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, U256};
use rail_core::{Asset, Charge, MemoryKeyStore, Money, RailReceiver as _, SystemClock};
use rail_x402::rail::X402Receiver;
use rail_x402::scheme::DEFAULT_MAX_TIMEOUT_SECONDS;
use rail_x402::wire::PaymentRequirements;
use rail_x402::{ExactEvm, Token};
use x402_devnet::DevnetFacilitator;

#[tokio::test]
async fn the_challenge_and_the_quotes_offer_publish_one_max_timeout() {
    assert_eq!(DEFAULT_MAX_TIMEOUT_SECONDS, 60);
    let token = Token::new("eip155:84532", Address::repeat_byte(0x5c), "USDC", "2");
    let pay_to = Address::repeat_byte(0x22);
    let facilitator = Arc::new(DevnetFacilitator::new("eip155:84532"));
    let challenge = ExactEvm::new(facilitator.clone(), token.clone(), pay_to)
        .requirements_for(U256::from(10_000u64));
    let receiver = X402Receiver::new(
        facilitator,
        token,
        pay_to,
        Arc::new(MemoryKeyStore::default()),
        Arc::new(SystemClock),
    );
    assert_eq!(receiver.max_timeout_seconds(), DEFAULT_MAX_TIMEOUT_SECONDS);
    // A Quote living 120 s (the Stipendex receiver's default), a shorter and a longer one.
    for ttl in [120, 30, 600] {
        let offer = receiver
            .offer(&Charge::capture(
                Money::parse(Asset::usdc(), "0.01").unwrap(),
                Duration::from_secs(ttl),
            ))
            .await
            .unwrap();
        let detail: PaymentRequirements = offer.details_as().unwrap();
        assert_eq!(
            detail.max_timeout_seconds, challenge.max_timeout_seconds,
            "a Quote living {ttl} s"
        );
        assert_eq!(detail.max_timeout_seconds, DEFAULT_MAX_TIMEOUT_SECONDS);
        assert_eq!(detail.amount, challenge.amount);
    }
    // Another window is given to both alike (`ExactEvm::max_timeout_seconds`).
    assert_eq!(
        receiver.with_max_timeout_seconds(90).max_timeout_seconds(),
        90
    );
}
