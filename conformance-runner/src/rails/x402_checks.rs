//! The x402 rail's own cases ([`conformance::Harness::rail_checks`]): every way a payment
//! can be wrong, a settlement that reverts, and a facilitator that misbehaves — each must leave
//! balances unchanged and serve nothing. They run on both tiers (the revert only on anvil: the
//! in-memory token cannot revert).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alloy_primitives::{Address, B256, U256};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use rail_core::MemoryKeyStore;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{
    LocalFacilitator, RemoteFacilitator, SettleConfig, X402Facilitator, X402SettlementBook,
};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::verify::reasons;
use rail_x402::wire::{Extra, PaymentPayload, PaymentRequired, PaymentRequirements};
use rail_x402::{ExactEvm, Token};
use x402_devnet::DevnetFacilitator;
use x402_devnet::anvil::Localnet;
use x402_transport::wire::PAYMENT_SIGNATURE;

type Check = Result<(), String>;

const PRICE: u64 = 1_000;

/// What the cases need from the harness.
pub(super) struct Ctx<'a> {
    pub facilitator: Arc<dyn X402Facilitator>,
    pub token: Token,
    pub mock: Option<&'a Arc<DevnetFacilitator>>,
    pub net: Option<&'a Localnet>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

impl Ctx<'_> {
    async fn fund(&self, amount: u64) -> Result<LocalSigner, String> {
        let key = LocalSigner::random();
        if let Some(m) = self.mock {
            m.mint(self.token.address, key.address(), U256::from(amount))
                .map_err(e)?;
        } else if let Some(n) = self.net {
            n.mint(key.address(), U256::from(amount)).await.map_err(e)?;
        }
        Ok(key)
    }

    async fn balance(&self, who: Address) -> Result<U256, String> {
        if let Some(m) = self.mock {
            return m.balance(self.token.address, who).map_err(e);
        }
        match self.net {
            Some(n) => n.balance(who).await.map_err(e),
            None => Err("no chain".into()),
        }
    }

    fn requirements(&self, pay_to: Address) -> PaymentRequirements {
        PaymentRequirements {
            scheme: "exact".into(),
            network: self.token.network.clone(),
            amount: PRICE.into(),
            asset: self.token.address.to_checksum(None),
            pay_to: pay_to.to_checksum(None),
            max_timeout_seconds: 60,
            extra: Some(Extra::eip712(&self.token.name, &self.token.version)),
        }
    }

    fn payer(&self, key: LocalSigner) -> X402Payer {
        X402Payer::new(
            key,
            Policy::new(&self.token.network, self.token.address, U256::MAX),
        )
    }

    /// `payload` is refused by verify and by settle with `reason`, and moves nothing.
    async fn refused(
        &self,
        payload: &PaymentPayload,
        req: &PaymentRequirements,
        reason: &str,
    ) -> Check {
        let from = payload.payload.authorization.from.address();
        let to: Address = req.pay_to.parse().map_err(e)?;
        let before = (self.balance(from).await?, self.balance(to).await?);
        let v = self.facilitator.verify(payload, req).await.map_err(e)?;
        if v.is_valid || v.invalid_reason.as_deref() != Some(reason) {
            return Err(format!("verify said {v:?}, expected {reason}"));
        }
        let s = self.facilitator.settle(payload, req).await.map_err(e)?;
        if s.success || s.error_reason.as_deref() != Some(reason) {
            return Err(format!("settle said {s:?}, expected {reason}"));
        }
        let after = (self.balance(from).await?, self.balance(to).await?);
        if before != after {
            return Err(format!("balances moved: {before:?} → {after:?}"));
        }
        Ok(())
    }
}

fn required(req: &PaymentRequirements) -> PaymentRequired {
    PaymentRequired {
        x402_version: rail_x402::wire::V2::default(),
        error: None,
        reason: None,
        resource: Some(rail_x402::wire::ResourceInfo::new("conformance:/paid")),
        accepts: vec![req.clone()],
        extensions: None,
    }
}

/// Signs `edit(req)` and presents it as a payment for `req`.
fn signed_as(
    key: &LocalSigner,
    req: &PaymentRequirements,
    t: u64,
    edit: impl FnOnce(&mut PaymentRequirements),
) -> Result<PaymentPayload, String> {
    let mut other = req.clone();
    edit(&mut other);
    // A payer whose policy allows what it is made to sign (a forger's or a buggy client's).
    let lax = X402Payer::new(
        key.clone(),
        Policy::new(&other.network, other.asset.parse().map_err(e)?, U256::MAX),
    );
    let mut p = lax
        .sign(
            &required(&other),
            &other,
            t,
            B256::from(rand::random::<[u8; 32]>()),
        )
        .map_err(e)?;
    p.accepted = req.clone();
    Ok(p)
}

/// Every case, named.
pub(super) async fn run(ctx: &Ctx<'_>) -> Vec<(String, Check)> {
    let mut out = Vec::new();
    let pay_to = LocalSigner::random().address();
    let req = ctx.requirements(pay_to);
    let t = now();
    let key = match ctx.fund(10 * PRICE).await {
        Ok(k) => k,
        Err(err) => return vec![("fund a payer".into(), Err(err))],
    };
    let payer = ctx.payer(key.clone());
    let fresh = || B256::from(rand::random::<[u8; 32]>());

    type Edit = Box<dyn FnOnce(&mut PaymentRequirements) + Send>;
    let tampered: Vec<(&str, Edit, &str)> = vec![
        (
            "wrong chain id",
            Box::new(|r| r.network = "eip155:1".into()),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "wrong domain name",
            Box::new(|r| r.extra = Some(Extra::eip712("Not USDC", "2"))),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "wrong domain version",
            Box::new(|r| r.extra = Some(Extra::eip712("USD Coin", "9"))),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "wrong token (verifyingContract)",
            Box::new(|r| r.asset = Address::repeat_byte(0x77).to_checksum(None)),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "value below the amount",
            Box::new(|r| r.amount = (PRICE - 1).into()),
            reasons::AUTHORIZATION_VALUE_MISMATCH,
        ),
        (
            "value above the amount",
            Box::new(|r| r.amount = (PRICE + 1).into()),
            reasons::AUTHORIZATION_VALUE_MISMATCH,
        ),
        (
            "to another recipient",
            Box::new(|r| r.pay_to = Address::repeat_byte(0x66).to_checksum(None)),
            reasons::RECIPIENT_MISMATCH,
        ),
    ];
    for (name, edit, reason) in tampered {
        let r = match signed_as(&key, &req, t, edit) {
            Ok(p) => ctx.refused(&p, &req, reason).await,
            Err(err) => Err(err),
        };
        out.push((format!("refused: {name} ({reason})"), r));
    }
    let window: Vec<(&str, u64, &str)> = vec![
        ("expired window", t - 3_600, reasons::VALID_BEFORE_EXPIRED),
        (
            "window not yet open",
            t + 3_600,
            reasons::VALID_AFTER_IN_FUTURE,
        ),
    ];
    for (name, at, reason) in window {
        let r = match payer.sign(&required(&req), &req, at, fresh()) {
            Ok(p) => ctx.refused(&p, &req, reason).await,
            Err(err) => Err(e(err)),
        };
        out.push((format!("refused: {name} ({reason})"), r));
    }
    // Signed by another key, claiming the payer.
    let forged = async {
        let other = ctx.payer(LocalSigner::random());
        let mut p = other.sign(&required(&req), &req, t, fresh()).map_err(e)?;
        p.payload.authorization.from = key.address().into();
        ctx.refused(&p, &req, reasons::INVALID_SIGNATURE).await
    }
    .await;
    out.push(("refused: signature by another key".into(), forged));
    let broke = async {
        let poor = ctx.payer(ctx.fund(PRICE - 1).await?);
        let p = poor.sign(&required(&req), &req, t, fresh()).map_err(e)?;
        ctx.refused(&p, &req, reasons::INSUFFICIENT_BALANCE).await
    }
    .await;
    out.push(("refused: insufficient balance".into(), broke));
    let reuse = async {
        let n = fresh();
        let first = payer.sign(&required(&req), &req, t, n).map_err(e)?;
        let s = ctx.facilitator.settle(&first, &req).await.map_err(e)?;
        if !s.success {
            return Err(format!("the genuine payment did not settle: {s:?}"));
        }
        let again = payer.sign(&required(&req), &req, t + 1, n).map_err(e)?;
        ctx.refused(&again, &req, reasons::NONCE_ALREADY_USED).await
    }
    .await;
    out.push(("refused: nonce reuse".into(), reuse));
    if let Some(net) = ctx.net {
        out.push((
            "a reverted settlement moves nothing and is not a success".into(),
            revert(ctx, net, &req).await,
        ));
    }
    for (name, fault) in FAULTS {
        out.push((
            format!("facilitator {name}: content not served"),
            not_served(ctx, *fault).await,
        ));
    }
    out
}

async fn revert(ctx: &Ctx<'_>, net: &Localnet, req: &PaymentRequirements) -> Check {
    let settler = net.funded_settler().await.map_err(e)?;
    let starved = LocalFacilitator::connect(
        net.rpc.clone(),
        settler,
        X402SettlementBook::new(Arc::new(MemoryKeyStore::default())),
    )
    .await
    .map_err(e)?
    .with_config(SettleConfig {
        gas_limit: 30_000,
        ..SettleConfig::default()
    });
    let key = ctx.fund(PRICE).await?;
    let p = ctx
        .payer(key.clone())
        .sign(
            &required(req),
            req,
            now(),
            B256::from(rand::random::<[u8; 32]>()),
        )
        .map_err(e)?;
    let s = starved.settle(&p, req).await.map_err(e)?;
    if s.success || s.error_reason.as_deref() != Some(reasons::TRANSACTION_FAILED) {
        return Err(format!("a reverted settlement said {s:?}"));
    }
    if ctx.balance(key.address()).await? != U256::from(PRICE) {
        return Err("the payer was charged by a reverted settlement".into());
    }
    // Still a good authorization: a working facilitator settles it once.
    let ok = ctx.facilitator.settle(&p, req).await.map_err(e)?;
    if !ok.success {
        return Err(format!(
            "the authorization did not settle afterwards: {ok:?}"
        ));
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Fault {
    Html502,
    Busy503WithSuccess,
    Truncated,
    Refused,
    SuccessWithoutTx,
    Hangs,
}

const FAULTS: &[(&str, Fault)] = &[
    ("answers an HTML 502", Fault::Html502),
    ("answers 503 with a success body", Fault::Busy503WithSuccess),
    ("answers a truncated body", Fault::Truncated),
    ("answers success:false", Fault::Refused),
    (
        "answers success without a transaction",
        Fault::SuccessWithoutTx,
    ),
    ("never answers (timeout)", Fault::Hangs),
];

/// A facilitator server that answers every `/settle` with `fault`.
async fn bad_facilitator(fault: Fault) -> Result<String, String> {
    let settle = move || async move {
        match fault {
            Fault::Html502 => (StatusCode::BAD_GATEWAY, "<html><h1>502 Bad Gateway</h1></html>").into_response_parts(),
            Fault::Busy503WithSuccess => (StatusCode::SERVICE_UNAVAILABLE, r#"{"success":true,"transaction":"0x01","network":"eip155:1"}"#).into_response_parts(),
            Fault::Truncated => (StatusCode::OK, r#"{"success":true,"transac"#).into_response_parts(),
            Fault::Refused => (StatusCode::OK, r#"{"success":false,"errorReason":"invalid_exact_evm_transaction_failed","transaction":"","network":"eip155:1"}"#).into_response_parts(),
            Fault::SuccessWithoutTx => (StatusCode::OK, r#"{"success":true,"transaction":"","network":"eip155:1"}"#).into_response_parts(),
            Fault::Hangs => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                (StatusCode::OK, "{}").into_response_parts()
            }
        }
    };
    let app = Router::new().route("/settle", post(settle));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(e)?;
    let addr = listener.local_addr().map_err(e)?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

trait Parts {
    fn into_response_parts(self) -> (StatusCode, String);
}

impl Parts for (StatusCode, &'static str) {
    fn into_response_parts(self) -> (StatusCode, String) {
        (self.0, self.1.to_owned())
    }
}

async fn not_served(ctx: &Ctx<'_>, fault: Fault) -> Check {
    let url = bad_facilitator(fault).await?;
    let remote = RemoteFacilitator::new(&url, Duration::from_millis(500)).map_err(e)?;
    let pay_to = LocalSigner::random().address();
    let hits = Arc::new(AtomicUsize::new(0));
    let seen = hits.clone();
    let paywall = ExactEvm::new(Arc::new(remote), ctx.token.clone(), pay_to)
        .paywall(&[("/paid", PRICE.into(), "paid")])
        .map_err(e)?;
    let app = paywall.apply(Router::new().route(
        "/paid",
        get(move || {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                "SECRET"
            }
        }),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(e)?;
    let addr = listener.local_addr().map_err(e)?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let http = rail_x402::rpc::http_client(Duration::from_secs(10)).map_err(e)?;
    let first = http
        .get(format!("http://{addr}/paid"))
        .send()
        .await
        .map_err(e)?;
    let header = first
        .headers()
        .get("payment-required")
        .and_then(|h| h.to_str().ok())
        .ok_or("no PAYMENT-REQUIRED")?
        .to_owned();
    let pr = PaymentRequired::from_header(&header).map_err(e)?;
    let key = ctx.fund(PRICE).await?;
    let payment = ctx.payer(key).pay(&pr).map_err(e)?;
    let r = http
        .get(format!("http://{addr}/paid"))
        .header(PAYMENT_SIGNATURE, payment.to_header().map_err(e)?)
        .send()
        .await
        .map_err(e)?;
    let status = r.status().as_u16();
    let body = r.text().await.map_err(e)?;
    if !(status == 402 || status == 503) || body.contains("SECRET") {
        return Err(format!("status {status}, body {body}"));
    }
    if hits.load(Ordering::SeqCst) != 0 {
        return Err("the paid handler ran".into());
    }
    if ctx.balance(pay_to).await? != U256::ZERO {
        return Err("the payee was paid".into());
    }
    Ok(())
}
