//! The rail's added latency over the emulator, per operation: the same Stripe calls made
//! with a bare HTTP client (form body, no checks) and through the rail (async-stripe builders,
//! typed parsing, idempotency records, the payer's pre-checks, verification's checks). An
//! example of the emulator's crate, which depends on the rail (never the other way).
//!
//! ```text
//! cargo run --release -p stripe-emulator --example latency [-- ITERATIONS]
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::indexing_slicing
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rail_core::{
    Asset, Charge, HoldReceiver, MemoryKeyStore, Money, OpId, RailReceiver, SystemClock,
};
use rail_stripe::{StripeHttp, StripePayer, StripeReceiver};
use serde_json::Value;
use stripe_emulator::{Emulator, EmulatorConfig};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let emu = Emulator::spawn(
        EmulatorConfig::default(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let base = emu.url.clone();
    let api = StripeHttp::new(&base, "sk_test_emulator").unwrap();
    let http = reqwest::Client::new();
    let card: Value = http
        .post(format!("{base}/_emulator/cards"))
        .bearer_auth("sk_test_emulator")
        .form(&[("limit", "100000000000")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let card = card["id"].as_str().unwrap().to_owned();
    let store = Arc::new(MemoryKeyStore::default());
    let clock = Arc::new(SystemClock);
    let receiver = StripeReceiver::new(
        api,
        "pk_test_emulator",
        "shop",
        Asset::usd(),
        store.clone(),
        clock.clone(),
    );
    let payer = StripePayer::new(
        &base,
        card.clone(),
        Money::from_minor(Asset::usd(), 1_000_000).unwrap(),
        clock,
    )
    .unwrap();
    let (mut raw_create, mut raw_confirm, mut raw_retrieve, mut raw_capture) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut rail_offer, mut rail_pay, mut rail_verify, mut rail_capture) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        // Bare HTTP: the four calls of a hold captured in part.
        let t = Instant::now();
        let pi: Value = http
            .post(format!("{base}/v1/payment_intents"))
            .bearer_auth("sk_test_emulator")
            .header("Idempotency-Key", format!("raw-create-{i}"))
            .form(&[
                ("amount", "1000"),
                ("currency", "usd"),
                ("capture_method", "manual"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        raw_create.push(t.elapsed());
        let id = pi["id"].as_str().unwrap().to_owned();
        let secret = pi["client_secret"].as_str().unwrap().to_owned();
        let t = Instant::now();
        let _: Value = http
            .post(format!("{base}/v1/payment_intents/{id}/confirm"))
            .bearer_auth("pk_test_emulator")
            .header("Idempotency-Key", format!("raw-confirm-{i}"))
            .form(&[
                ("payment_method", card.as_str()),
                ("client_secret", secret.as_str()),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        raw_confirm.push(t.elapsed());
        let t = Instant::now();
        let _: Value = http
            .get(format!(
                "{base}/v1/payment_intents/{id}?expand[0]=latest_charge"
            ))
            .bearer_auth("sk_test_emulator")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        raw_retrieve.push(t.elapsed());
        let t = Instant::now();
        let _: Value = http
            .post(format!("{base}/v1/payment_intents/{id}/capture"))
            .bearer_auth("sk_test_emulator")
            .header("Idempotency-Key", format!("raw-capture-{i}"))
            .form(&[("amount_to_capture", "600")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        raw_capture.push(t.elapsed());

        // The rail: the same hold captured in part.
        let t = Instant::now();
        let o = receiver
            .offer(&Charge::hold(
                Money::from_minor(Asset::usd(), 1000).unwrap(),
                Duration::from_secs(600),
            ))
            .await
            .unwrap();
        rail_offer.push(t.elapsed());
        let t = Instant::now();
        let p = rail_core::HoldPayer::hold(&payer, &OpId::random(), &o)
            .await
            .unwrap();
        rail_pay.push(t.elapsed());
        let t = Instant::now();
        let v = receiver.verify(&o, &p).await.unwrap();
        rail_verify.push(t.elapsed());
        let t = Instant::now();
        receiver
            .capture(
                &OpId::random(),
                &v,
                &Money::from_minor(Asset::usd(), 600).unwrap(),
            )
            .await
            .unwrap();
        rail_capture.push(t.elapsed());
    }
    println!("{n} iterations, median per operation (emulator in process, release build)");
    println!(
        "{:<10} {:>12} {:>12} {:>12}",
        "operation", "bare HTTP", "rail", "added"
    );
    for (name, raw, rail, calls) in [
        ("offer", &mut raw_create, &mut rail_offer, "1 call"),
        (
            "pay/hold",
            &mut raw_confirm,
            &mut rail_pay,
            "2 calls: retrieve + confirm",
        ),
        (
            "verify",
            &mut raw_retrieve,
            &mut rail_verify,
            "1 call + replay guard",
        ),
        (
            "capture",
            &mut raw_capture,
            &mut rail_capture,
            "2 calls: retrieve + capture",
        ),
    ] {
        let (a, b) = (median(raw), median(rail));
        println!(
            "{name:<10} {:>10}µs {:>10}µs {:>10}µs  ({calls})",
            a.as_micros(),
            b.as_micros(),
            b.saturating_sub(a).as_micros()
        );
    }
}
