//! Property tests for the decoders this crate adds on top of the headers: facilitator request
//! and response bodies, MCP `_meta` payments, JSON-RPC answers. None may panic on any input;
//! each mutation of a valid body either decodes to the same meaning or is refused.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;

use alloy_primitives::{Address, B256, U256};
use proptest::prelude::*;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{FacilitatorRequest, SupportedResponse};
use rail_x402::mcp::payment_required_of;
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::wire::{
    Extra, PaymentRequired, PaymentRequirements, ResourceInfo, SettleResponse, V2, VerifyResponse,
};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{Value, json};
use x402_devnet::DevnetFacilitator;

fn valid_request() -> Value {
    let token = Address::repeat_byte(0x11);
    let req = PaymentRequirements {
        scheme: "exact".into(),
        network: "eip155:84532".into(),
        amount: 1000u64.into(),
        asset: token.to_checksum(None),
        pay_to: Address::repeat_byte(0x22).to_checksum(None),
        max_timeout_seconds: 60,
        extra: Some(Extra::eip712("USDC", "2")),
    };
    let pr = PaymentRequired {
        x402_version: V2::default(),
        error: None,
        reason: None,
        resource: Some(ResourceInfo::new("http://x/y")),
        accepts: vec![req.clone()],
        extensions: None,
    };
    let payer = X402Payer::new(
        LocalSigner::from_hex(&"42".repeat(32)).unwrap(),
        Policy::new("eip155:84532", token, U256::from(1000)),
    );
    let p = payer
        .sign(&pr, &req, 1_800_000_000, B256::repeat_byte(3))
        .unwrap();
    serde_json::to_value(FacilitatorRequest {
        x402_version: 2,
        payment_payload: p,
        payment_requirements: req,
    })
    .unwrap()
}

/// Replaces the value at a random JSON path with `new`.
fn edit(v: &mut Value, path: &[usize], new: Value) {
    match (path.split_first(), v) {
        (Some((i, rest)), Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth(i % m.len()).cloned().unwrap();
            edit(m.get_mut(&k).unwrap(), rest, new);
        }
        (Some((i, rest)), Value::Array(a)) if !a.is_empty() => {
            let n = a.len();
            edit(&mut a[i % n], rest, new);
        }
        (_, slot) => *slot = new,
    }
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        Just(json!("0x")),
        Just(json!("1000")),
        Just(json!({})),
        Just(json!([])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn body_decoders_never_panic_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = serde_json::from_slice::<FacilitatorRequest>(&bytes);
        let _ = serde_json::from_slice::<SettleResponse>(&bytes);
        let _ = serde_json::from_slice::<VerifyResponse>(&bytes);
        let _ = serde_json::from_slice::<SupportedResponse>(&bytes);
    }

    #[test]
    fn edited_facilitator_requests_decode_or_are_refused(
        path in proptest::collection::vec(any::<usize>(), 1..6),
        new in arb_json(),
    ) {
        let original = valid_request();
        let mut v = original.clone();
        edit(&mut v, &path, new);
        if let Ok(r) = serde_json::from_value::<FacilitatorRequest>(v.clone()) {
            // Whatever decodes re-encodes to the same JSON: nothing is dropped or rewritten
            // silently (no unknown fields, canonical spellings only). An explicit `null` for
            // an optional field reads as absent.
            prop_assert_eq!(serde_json::to_value(&r).unwrap(), strip_nulls(v));
        }
    }

    #[test]
    fn settle_answers_never_read_success_from_anything_but_true(
        path in proptest::collection::vec(any::<usize>(), 1..3),
        new in arb_json(),
    ) {
        let mut v = json!({"success": false, "errorReason": "x", "transaction": "", "network": "eip155:1"});
        edit(&mut v, &path, new);
        if let Ok(s) = serde_json::from_value::<SettleResponse>(v.clone()) {
            prop_assert_eq!(s.success, v["success"] == json!(true));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any `_meta["x402/payment"]` value: a refusal (payment required), never the tool.
    #[test]
    fn mcp_meta_payments_never_run_the_tool_unpaid(
        path in proptest::collection::vec(any::<usize>(), 0..6),
        new in arb_json(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut payment = valid_request()["paymentPayload"].clone();
        if !path.is_empty() {
            edit(&mut payment, &path, new);
        }
        let params: CallToolRequestParams = serde_json::from_value(json!({
            "name": "t", "_meta": {"x402/payment": payment}
        })).unwrap();
        let paywall = rail_x402::ExactEvm::new(
            Arc::new(DevnetFacilitator::new("eip155:84532")),
            rail_x402::Token::new("eip155:84532", Address::repeat_byte(0x11), "USDC", "2"),
            Address::repeat_byte(0x22),
        ).mcp_paywall(&[("t", 1000, "t")]).unwrap();
        let ran = std::sync::atomic::AtomicBool::new(false);
        let r = rt.block_on(paywall.call_params(&params, || async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            CallToolResult::success(vec![])
        }));
        // The payer holds no balance in the mock: nothing can settle, so nothing may run.
        prop_assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
        prop_assert!(payment_required_of(&r).is_some());
    }
}
