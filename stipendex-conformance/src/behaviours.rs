//! The Stipendex protocol behaviours: the wallet and the receiver of the `stipendex` crate,
//! wrapped around the rail under test, on every rail the suite knows.
//!
//! Each behaviour builds a fresh principal, wallet and receiver over the harness's rail (both
//! sides), on the harness's clock, and checks one rule of the invariants (I1–I5,
//! `docs/stipendex-profile.md` §0) end to end, with the rail's real balances.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rail_core::{Clock, MemoryKeyStore, Money, PayEffect, PayerHandle, ReceiverHandle};
use stipendex::envelope::{Allow, Limits, Mandate, Party, SecretKey, Signed};
use stipendex::receiver::{Gate, PricedCapability, Receiver, Request};
use stipendex::wallet::{Answer, Callback, MemoryJournal, Wallet, chain_name};

use conformance::behaviours::{Behaviour, Needs, SKIP_NO_HOOK, Verdict};
use conformance::{Balances, Harness};

use crate::{StipendexHarness, X402Parts};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The price of every Stipendex behaviour, in minor units (as `pay_then_verify`'s).
const PRICE: u128 = 125;

fn s<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A principal, a wallet and a receiver over the harness's rail.
struct Scene {
    wallet: Wallet,
    wallet_key: SecretKey,
    receiver_key: SecretKey,
    receiver: Receiver,
    principal: SecretKey,
    journal: Arc<MemoryJournal>,
    asked: Arc<AtomicBool>,
    price: Money,
}

struct Options {
    /// The receiver is in the allowlist.
    allowlisted: bool,
    /// The per-call limit, in minor units.
    per_call: u128,
    /// Confirm above this many minor units.
    confirm_above: Option<u128>,
    /// The human says yes.
    confirm: bool,
    /// The origins the mandate pins the receiver at (and the receiver names).
    origins: Vec<String>,
    /// The wallet's first payment is made but its answer is lost (`unavailable`).
    lose_first_answer: bool,
    /// The mandate allows tabs up to this cap (minor units), two open at once.
    tab_cap: Option<u128>,
    /// The receiver offers tabs of `tab_cap` with 2 lanes.
    offer_tabs: bool,
    /// The mandate's total limit, in minor units.
    total: u128,
    /// The receiver's guard ([`stipendex::receiver::Ready`]), if any.
    ready: Option<Arc<dyn stipendex::receiver::Ready>>,
    /// The receiver's price hook, if not the list price.
    hook: Option<Arc<dyn stipendex::receiver::ResolvePrice>>,
}

/// The work behind a receiver, away or not (the receiver's guard asks it).
#[derive(Default)]
struct Away(AtomicBool);

impl Away {
    fn set(&self, away: bool) {
        self.0.store(away, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl stipendex::receiver::Ready for Away {
    async fn ready(&self) -> Result<(), String> {
        if self.0.load(Ordering::SeqCst) {
            Err("the conformance service is away".into())
        } else {
            Ok(())
        }
    }
}

/// Where the tab behaviours' receiver is served (a tab names its origin).
const TAB_ORIGIN: &str = "https://shop.example";

impl Default for Options {
    fn default() -> Self {
        Options {
            allowlisted: true,
            per_call: PRICE * 4,
            confirm_above: None,
            confirm: true,
            origins: Vec::new(),
            lose_first_answer: false,
            tab_cap: None,
            offer_tabs: false,
            total: PRICE * 20,
            ready: None,
            hook: None,
        }
    }
}

fn money(h: &dyn Harness, minor: u128) -> Result<Money, String> {
    Money::from_minor(h.asset(), minor).map_err(s("amount"))
}

fn scene(h: &dyn Harness, o: &Options) -> Result<Scene, String> {
    let rail = h.rail();
    let clock: rail_core::SharedClock = Arc::new(h.clock().clone());
    let now = u64::try_from(h.clock().now().unix_seconds()).map_err(s("clock"))?;
    let (principal, wallet_key, receiver_key) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    let price = money(h, PRICE)?;
    let receiver = Receiver::builder("conformance-shop", receiver_key.clone())
        .rail(
            "rail",
            ReceiverHandle {
                receiver: rail.receiver.clone(),
                hold_receiver: rail.hold_receiver.clone(),
                refunds: rail.refunds.clone(),
            },
        )
        .price(PricedCapability::fixed("GET", "/paid", price.clone()))
        .clock(clock.clone());
    let receiver = o
        .origins
        .iter()
        .fold(receiver, stipendex::receiver::Builder::origin);
    let caps = rail.capabilities();
    let receiver = if caps.hold && caps.partial_capture {
        receiver.price(PricedCapability::estimate(
            "POST",
            "/checkout",
            money(h, PRICE - 25)?,
            money(h, 25)?.amount(),
        ))
    } else {
        receiver
    };
    let receiver = match o.tab_cap.filter(|_| o.offer_tabs) {
        Some(cap) => receiver.tabs(stipendex::receiver::TabTerms::new(money(h, cap)?).lanes(2)),
        None => receiver,
    };
    let receiver = match &o.ready {
        Some(r) => receiver.ready(r.clone()),
        None => receiver,
    };
    let receiver = match &o.hook {
        Some(hook) => receiver.resolve_price(hook.clone()),
        None => receiver,
    };
    let receiver = receiver.build().map_err(s("receiver"))?;
    let mut m = Mandate::draft(
        Party {
            id: "principal".into(),
            key: principal.public(),
        },
        wallet_key.public(),
        now.saturating_sub(1),
        86_400,
    );
    let minor = |u: u128| money(h, u).map(|m| m.amount());
    m.limits.push(Limits {
        asset: h.asset(),
        per_call: Some(minor(o.per_call)?),
        per_period: None,
        total: Some(minor(o.total)?),
        per_receiver: None,
        confirm_above: o.confirm_above.map(minor).transpose()?,
        tab_cap: o.tab_cap.map(minor).transpose()?,
        open_tabs: o.tab_cap.map(|_| 2),
    });
    if o.allowlisted {
        m.allow.push(Allow::Receiver {
            id: "conformance-shop".into(),
            key: receiver_key.public(),
            origins: o.origins.clone(),
        });
    }
    let mandate = Signed::sign(m, &principal).map_err(s("mandate"))?;
    let asked = Arc::new(AtomicBool::new(false));
    let (yes, flag) = (o.confirm, asked.clone());
    let journal = Arc::new(MemoryJournal::default());
    let wallet_key_copy = wallet_key.clone();
    let payer: Arc<dyn rail_core::Payer> = if o.lose_first_answer {
        Arc::new(LosesFirstAnswer {
            inner: rail.payer.clone(),
            lost: AtomicBool::new(false),
        })
    } else {
        rail.payer.clone()
    };
    let wallet = Wallet::builder(wallet_key, mandate)
        .rail(
            "rail",
            PayerHandle {
                payer,
                hold_payer: rail.hold_payer.clone(),
            },
        )
        .store(Arc::new(MemoryKeyStore::with_clock(clock.clone())))
        .confirmer(Arc::new(Callback::new(move |_| {
            flag.store(true, Ordering::SeqCst);
            if yes {
                Answer::Yes {
                    by: "conformance".into(),
                }
            } else {
                Answer::No {
                    why: "the conformance human says no".into(),
                }
            }
        })))
        .journal(journal.clone())
        .clock(clock)
        .principal(principal.public())
        .build()
        .map_err(s("wallet"))?;
    Ok(Scene {
        wallet,
        wallet_key: wallet_key_copy,
        receiver_key: receiver_key.clone(),
        receiver,
        principal,
        journal,
        asked,
        price,
    })
}

fn paid_req() -> Request {
    Request::new("GET", "/paid")
}

async fn quote(sc: &Scene, req: &Request) -> Result<Signed<stipendex::envelope::Quote>, String> {
    match sc.receiver.gate(req).await.map_err(s("quote"))? {
        Gate::Quote(q) => Ok(*q),
        other => Err(format!("expected a quote, got {other:?}")),
    }
}

async fn balances(h: &dyn Harness) -> Result<Balances, String> {
    h.balances().await.map_err(s("balances"))
}

fn units(m: &Money) -> i128 {
    i128::try_from(m.minor_units()).unwrap_or(i128::MAX)
}

/// Expects the error code `code`.
fn refused<T>(what: &str, r: Result<T, stipendex::Error>, code: &str) -> Verdict {
    match r {
        Ok(_) => Err(format!("{what} was accepted; expected {code}")),
        Err(e) if e.code() == code => Ok(()),
        Err(e) => Err(format!("{what}: expected {code}, got {} ({e})", e.code())),
    }
}

async fn unchanged(h: &dyn Harness, before: Balances, what: &str) -> Verdict {
    let after = balances(h).await?;
    ensure!(
        after == before,
        "{what} moved money: {before:?} -> {after:?}"
    );
    Ok(())
}

/// Pays a quote, has it accepted and receipted; returns the chain's objects.
async fn pay_through(sc: &Scene) -> Result<Vec<String>, String> {
    let req = paid_req();
    let q = quote(sc, &req).await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("pay"))?;
    let accepted = sc
        .receiver
        .accept(&req, paid.proof.jws())
        .await
        .map_err(s("accept"))?;
    let receipt = sc
        .receiver
        .receipt(&accepted, b"result")
        .map_err(s("receipt"))?;
    sc.wallet
        .receipt(&paid, receipt.jws())
        .await
        .map_err(s("wallet receipt"))?;
    Ok(sc
        .journal
        .chain(&chain_name("conformance-shop", &q.object().id)))
}

// ------------------------------------------------------------------------------------------

async fn stipendex_receipt_chain_verifies(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let before = balances(h).await?;
    let chain = pay_through(&sc).await?;
    ensure!(
        chain.len() == 4,
        "the journal holds {} objects, not 4",
        chain.len()
    );
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    let c = stipendex::chain::verify_chain(&refs, Some(&sc.principal.public()))
        .map_err(s("verify_chain"))?;
    ensure!(c.receipt.is_some(), "the chain has no receipt");
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sc.price),
        "the payee received {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&sc.price)
    );
    Ok(())
}

async fn stipendex_allowlist_denial(h: &dyn Harness) -> Verdict {
    let sc = scene(
        h,
        &Options {
            allowlisted: false,
            ..Options::default()
        },
    )?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    refused(
        "paying a receiver outside the allowlist",
        sc.wallet.pay(&q).await,
        "denied",
    )?;
    unchanged(h, before, "a denial").await
}

async fn stipendex_limit_exceeded(h: &dyn Harness) -> Verdict {
    let sc = scene(
        h,
        &Options {
            per_call: PRICE - 1,
            ..Options::default()
        },
    )?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    refused(
        "paying above the per-call limit",
        sc.wallet.pay(&q).await,
        "limit_exceeded",
    )?;
    unchanged(h, before, "a limit refusal").await
}

async fn stipendex_revoked_mandate(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let now = u64::try_from(h.clock().now().unix_seconds()).map_err(s("clock"))?;
    let revocation =
        stipendex::wallet::revoke(sc.wallet.mandate(), &sc.principal, now).map_err(s("revoke"))?;
    stipendex::wallet::Revocations::new(sc.wallet.store().clone())
        .record(&revocation)
        .await
        .map_err(s("record"))?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    refused(
        "paying under a revoked mandate",
        sc.wallet.pay(&q).await,
        "revoked",
    )?;
    unchanged(h, before, "a revoked mandate").await
}

async fn stipendex_hitl_required(h: &dyn Harness) -> Verdict {
    let no = scene(
        h,
        &Options {
            confirm_above: Some(PRICE - 1),
            confirm: false,
            ..Options::default()
        },
    )?;
    let before = balances(h).await?;
    let q = quote(&no, &paid_req()).await?;
    refused(
        "a payment the human declined",
        no.wallet.pay(&q).await,
        "not_confirmed",
    )?;
    ensure!(no.asked.load(Ordering::SeqCst), "the human was never asked");
    unchanged(h, before, "a declined confirmation").await?;
    let yes = scene(
        h,
        &Options {
            confirm_above: Some(PRICE - 1),
            ..Options::default()
        },
    )?;
    let chain = pay_through(&yes).await?;
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    let c = stipendex::chain::verify_chain(&refs, None).map_err(s("verify_chain"))?;
    ensure!(
        c.confirmation.is_some(),
        "a confirmed payment's chain has no confirmation"
    );
    Ok(())
}

async fn stipendex_expired_quote(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let q = quote(&sc, &paid_req()).await?;
    let before = balances(h).await?;
    h.clock().advance(Duration::from_secs(121));
    refused(
        "paying an expired quote",
        sc.wallet.pay(&q).await,
        "expired",
    )?;
    unchanged(h, before, "an expired quote").await
}

async fn stipendex_quote_reuse(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    let first = sc.wallet.pay(&q).await.map_err(s("pay"))?;
    let second = sc.wallet.pay(&q).await.map_err(s("pay again"))?;
    ensure!(
        !second.fresh && second.proof.jws() == first.proof.jws(),
        "paying a quote twice must return its first proof"
    );
    sc.receiver
        .accept(&paid_req(), first.proof.jws())
        .await
        .map_err(s("accept"))?;
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sc.price),
        "a quote paid twice moved {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&sc.price)
    );
    Ok(())
}

async fn stipendex_proof_replay(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let q = quote(&sc, &paid_req()).await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("pay"))?;
    sc.receiver
        .accept(&paid_req(), paid.proof.jws())
        .await
        .map_err(s("accept"))?;
    let before = balances(h).await?;
    refused(
        "a replayed proof",
        sc.receiver.accept(&paid_req(), paid.proof.jws()).await,
        "quote_used",
    )?;
    unchanged(h, before, "a replayed proof").await
}

async fn stipendex_capture_above_confirmed_refused(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let req = Request::new("POST", "/checkout");
    let q = quote(&sc, &req).await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("hold"))?;
    ensure!(paid.confirmation.is_some(), "a checkout must be confirmed");
    let accepted = sc
        .receiver
        .accept(&req, paid.proof.jws())
        .await
        .map_err(s("accept"))?;
    let max = q.object().max().map_err(s("max"))?;
    let above = money(h, max.minor_units() + 1)?;
    let before = balances(h).await?;
    refused(
        "capturing above the quote",
        sc.receiver.capture(&accepted, &above, b"").await,
        "capture_above",
    )?;
    unchanged(h, before, "a refused capture").await?;
    let final_amount = money(h, PRICE - 25)?;
    let (_, receipt) = sc
        .receiver
        .capture(&accepted, &final_amount, b"order")
        .await
        .map_err(s("capture"))?;
    sc.wallet
        .receipt(&paid, receipt.jws())
        .await
        .map_err(s("wallet receipt"))?;
    let chain = sc
        .journal
        .chain(&chain_name("conformance-shop", &q.object().id));
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&refs, None).map_err(s("verify_chain"))?;
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&final_amount),
        "the capture moved {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&final_amount)
    );
    Ok(())
}

async fn stipendex_tampered_chain_detected(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let chain = pay_through(&sc).await?;
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    // A byte of the proof's signature flipped.
    let mut proof = refs.get(2).ok_or("no proof")?.as_bytes().to_vec();
    let i = proof.len().saturating_sub(3);
    if let Some(b) = proof.get_mut(i) {
        *b = if *b == b'A' { b'B' } else { b'A' };
    }
    let proof = String::from_utf8(proof).map_err(s("utf8"))?;
    let mut tampered = refs.clone();
    if let Some(slot) = tampered.get_mut(2) {
        *slot = &proof;
    }
    match stipendex::chain::verify_chain(&tampered, None) {
        Err(stipendex::Error::Broken { link: "proof", .. }) => {}
        other => {
            return Err(format!(
                "a tampered proof: expected a broken proof link, got {other:?}"
            ));
        }
    }
    // A receipt signed by another receiver.
    let other = scene(h, &Options::default())?;
    let other_chain = pay_through(&other).await?;
    let mut swapped = refs.clone();
    if let (Some(slot), Some(r)) = (swapped.get_mut(3), other_chain.get(3)) {
        *slot = r;
    }
    match stipendex::chain::verify_chain(&swapped, None) {
        Err(stipendex::Error::Broken {
            link: "receipt", ..
        }) => Ok(()),
        other => Err(format!(
            "a foreign receipt: expected a broken receipt link, got {other:?}"
        )),
    }
}

/// A plain x402 402 (the rail's own scheme behind the shared paywall), paid by the wallet
/// under the mandate: allowlisted by origin and `payTo`, counted against the limits, recorded
/// as a challenge proof; the same wallet without the allowlist entry is denied.
async fn stipendex_x402_402_paid_under_mandate(h: &dyn StipendexHarness) -> Verdict {
    use axum::routing::get;
    use x402_transport::paywall::Paywall;
    let Some(parts) = h.x402().await else {
        return Err(SKIP_NO_HOOK.into());
    };
    let clock: rail_core::SharedClock = Arc::new(h.clock().clone());
    let accepts =
        x402_transport::Accepts::one(parts.scheme.clone(), PRICE).map_err(s("accepts"))?;
    let app = Paywall::new()
        .with_clock(clock.clone())
        .route("/x402", "conformance", accepts)
        .apply(axum::Router::new().route("/x402", get(|| async { "paid content" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(s("listen"))?;
    let base = format!("http://{}", listener.local_addr().map_err(s("listen"))?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let out = x402_paid(h, &parts, &base, clock).await;
    server.abort();
    out
}

async fn x402_paid(
    h: &dyn Harness,
    parts: &X402Parts,
    base: &str,
    clock: rail_core::SharedClock,
) -> Verdict {
    let http = || stipendex::http::reqwest_builder(Duration::from_secs(30));
    let now = u64::try_from(h.clock().now().unix_seconds()).map_err(s("clock"))?;
    let principal = SecretKey::generate();
    let wallet_key = SecretKey::generate();
    let wallet = |allow: bool| -> Result<Wallet, String> {
        let mut m = Mandate::draft(
            Party {
                id: "principal".into(),
                key: principal.public(),
            },
            wallet_key.public(),
            now.saturating_sub(1),
            86_400,
        );
        m.limits.push(Limits {
            asset: h.asset(),
            per_call: Some(money(h, PRICE * 4)?.amount()),
            per_period: None,
            total: Some(money(h, PRICE * 20)?.amount()),
            per_receiver: None,
            confirm_above: None,
            tab_cap: None,
            open_tabs: None,
        });
        if allow {
            m.allow.push(Allow::X402Http {
                origin: base.to_owned(),
                pay_to: parts.pay_to.clone(),
            });
        }
        Wallet::builder(
            wallet_key.clone(),
            Signed::sign(m, &principal).map_err(s("mandate"))?,
        )
        .scheme_payer(parts.payer.clone())
        .store(Arc::new(MemoryKeyStore::with_clock(clock.clone())))
        .clock(clock.clone())
        .build()
        .map_err(s("wallet"))
    };
    let url = format!("{base}/x402");

    // Not allowlisted: denied, nothing signed, nothing moves.
    let before = balances(h).await?;
    let denied = stipendex::http::Client::new(http(), wallet(false)?).map_err(s("client"))?;
    refused(
        "an x402 402 outside the allowlist",
        denied.get(&url).await,
        "denied",
    )?;
    unchanged(h, before, "a denied x402 402").await?;

    // Allowlisted: paid once, the price moves, the challenge proof verifies.
    let client = stipendex::http::Client::new(http(), wallet(true)?).map_err(s("client"))?;
    let r = client.get(&url).await.map_err(s("pay the x402 402"))?;
    ensure!(
        r.status.as_u16() == 200,
        "the paid retry answered {}",
        r.status
    );
    let paid = r.x402.ok_or("the response records no x402 payment")?;
    ensure!(
        paid.amount == money(h, PRICE)?,
        "signed for {} instead of {PRICE} minor units",
        paid.amount
    );
    ensure!(
        paid.proof.object().challenge.is_some(),
        "the proof does not record the challenge"
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == i128::try_from(PRICE).unwrap_or(0),
        "the payee received {} instead of {PRICE}",
        after.payee_settled - before.payee_settled
    );
    Ok(())
}

// ---- The HTTP boundary (issue 23): attacks that apply to every rail. ----------------------

/// A listener on loopback and its origin.
async fn listen() -> Result<(tokio::net::TcpListener, String), String> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(s("listen"))?;
    let base = format!("http://{}", l.local_addr().map_err(s("listen"))?);
    Ok((l, base))
}

/// The scene's receiver served over the HTTP binding at its own origin: `GET /paid` (and
/// `POST /checkout` where the rail can hold) counting each run of the handler, `GET /moved`
/// redirecting to `moved_to`, and — outside the binding, as a proxy would — every request that
/// carries a payment header bounced to `bounce_to`.
struct Served {
    sc: Scene,
    base: String,
    runs: Arc<std::sync::atomic::AtomicUsize>,
    /// While set, `GET /paid` answers as work that never reached the service behind
    /// ([`stipendex::http::Undelivered`]), and does not run.
    undelivered: Arc<AtomicBool>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Served {
    fn client(&self) -> Result<stipendex::http::Client, String> {
        stipendex::http::Client::new(
            stipendex::http::reqwest_builder(Duration::from_secs(30)),
            self.sc.wallet.clone(),
        )
        .map_err(s("client"))
    }

    fn ran(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

async fn served(
    h: &dyn Harness,
    moved_to: Option<String>,
    bounce_to: Option<String>,
) -> Result<Served, String> {
    served_with(h, moved_to, bounce_to, Options::default()).await
}

/// As [`served`], the scene made with `o` (its origins the served one). `GET /paid?q=redirect`
/// answers with a redirect (a paid 3xx).
async fn served_with(
    h: &dyn Harness,
    moved_to: Option<String>,
    bounce_to: Option<String>,
    o: Options,
) -> Result<Served, String> {
    use axum::response::{IntoResponse, Redirect};
    use axum::routing::{get, post};
    let (listener, base) = listen().await?;
    let sc = scene(
        h,
        &Options {
            origins: vec![base.clone()],
            ..o
        },
    )?;
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let undelivered = Arc::new(AtomicBool::new(false));
    let (r1, r2, away) = (runs.clone(), runs.clone(), undelivered.clone());
    let moved = moved_to.unwrap_or_else(|| "/".into());
    let app = stipendex::http::Binding::new(sc.receiver.clone())
        .map_err(s("binding"))?
        .apply(
            axum::Router::new()
                .route(
                    "/paid",
                    axum::routing::any(move |uri: axum::http::Uri| {
                        let (runs, away) = (r1.clone(), away.clone());
                        async move {
                            if away.load(Ordering::SeqCst) {
                                let mut r = (axum::http::StatusCode::BAD_GATEWAY, "unreachable")
                                    .into_response();
                                r.extensions_mut().insert(stipendex::http::Undelivered);
                                return r;
                            }
                            runs.fetch_add(1, Ordering::SeqCst);
                            if uri.query() == Some("q=redirect") {
                                return Redirect::temporary("/elsewhere").into_response();
                            }
                            "PAID WORK".into_response()
                        }
                    }),
                )
                .route(
                    "/checkout",
                    post(move || {
                        r2.fetch_add(1, Ordering::SeqCst);
                        async { "PAID WORK" }
                    }),
                )
                .route(
                    "/moved",
                    get(move || {
                        let to = moved.clone();
                        async move { Redirect::temporary(&to) }
                    }),
                ),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let bounce = bounce_to.clone();
                async move {
                    let paid = ["stipendex-payment", "payment-signature", "x-payment"]
                        .iter()
                        .any(|n| req.headers().contains_key(*n));
                    match bounce {
                        Some(to) if paid => Redirect::temporary(&to).into_response(),
                        _ => next.run(req).await,
                    }
                }
            },
        ));
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Served {
        sc,
        base,
        runs,
        undelivered,
        server,
    })
}

/// A hostile server: answers every request with what it gets itself from `target` (an
/// allowlisted receiver's 402 for its own request), and records every payment header it is
/// sent.
struct Relay {
    base: String,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Relay {
    fn saw_a_payment(&self) -> bool {
        self.seen.lock().map(|v| !v.is_empty()).unwrap_or(true)
    }
}

async fn relay(listener: tokio::net::TcpListener, base: String, target: String) -> Relay {
    use axum::response::IntoResponse;
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let http = stipendex::http::reqwest_client(Duration::from_secs(30)).ok();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (target, record, http) = (target.clone(), record.clone(), http.clone());
        async move {
            for (name, v) in req.headers() {
                if name.as_str().contains("payment")
                    && let Ok(mut seen) = record.lock()
                {
                    seen.push(v.to_str().unwrap_or("?").to_owned());
                }
            }
            let Some(http) = http else {
                return axum::http::StatusCode::BAD_GATEWAY.into_response();
            };
            match http.get(&target).send().await {
                Ok(got) => {
                    let status = axum::http::StatusCode::from_u16(got.status().as_u16())
                        .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
                    (status, got.bytes().await.unwrap_or_default()).into_response()
                }
                Err(_) => axum::http::StatusCode::BAD_GATEWAY.into_response(),
            }
        }
    });
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Relay { base, seen, server }
}

/// `method path` as raw bytes (no client normalises the path): the status and the response.
async fn raw(base: &str, method: &str, path: &str) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut c = tokio::net::TcpStream::connect(host)
        .await
        .map_err(s("connect"))?;
    c.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(s("write"))?;
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.map_err(s("read"))?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, text))
}

/// A Quote the evil origin got from the allowlisted receiver for its own request, relayed to
/// the agent (at evil's origin, and behind a backslash URL a naive split reads as the
/// receiver's): denied, nothing sent to evil, nothing moves.
async fn stipendex_relayed_quote_refused(h: &dyn Harness) -> Verdict {
    let sv = served(h, None, None).await?;
    let (l, evil) = listen().await?;
    let relay = relay(l, evil.clone(), format!("{}/paid?q=evil", sv.base)).await;
    let client = sv.client()?;
    let before = balances(h).await?;
    let host = sv.base.trim_start_matches("http://");
    for url in [
        format!("{}/paid?q=evil", relay.base),
        format!("{}\\@{host}/paid?q=evil", relay.base),
    ] {
        refused(
            &format!("a relayed quote ({url})"),
            client.get(&url).await,
            "denied",
        )?;
    }
    ensure!(!relay.saw_a_payment(), "the relay was sent a payment");
    ensure!(sv.ran() == 0, "the priced handler ran");
    unchanged(h, before, "a relayed quote").await
}

/// An unpaid redirect to another origin is judged where it lands (a relayed 402 there is
/// denied); a paid request answered with a redirect is not followed: the payment header never
/// reaches the other origin.
async fn stipendex_redirect_carries_no_payment(h: &dyn Harness) -> Verdict {
    let (l, evil) = listen().await?;
    let sv = served(
        h,
        Some(format!("{evil}/collect")),
        Some(format!("{evil}/collect")),
    )
    .await?;
    let relay = relay(l, evil, format!("{}/paid?q=evil", sv.base)).await;
    let client = sv.client()?;
    let before = balances(h).await?;
    refused(
        "a 307 to another origin before payment",
        client.get(&format!("{}/moved", sv.base)).await,
        "denied",
    )?;
    unchanged(h, before, "a redirect before payment").await?;
    match client.get(&format!("{}/paid", sv.base)).await {
        Ok(r) => ensure!(
            r.status.is_redirection() && r.receipt.is_none(),
            "a paid request bounced by a 307 answered {} (receipt: {})",
            r.status,
            r.receipt.is_some()
        ),
        // A rail whose payment is refused later is fine too: what matters is below.
        Err(e) => ensure!(e.code() != "denied", "the paid request was denied: {e}"),
    }
    ensure!(
        !relay.saw_a_payment(),
        "a payment header followed a redirect to another origin"
    );
    ensure!(sv.ran() == 0, "the priced handler ran");
    Ok(())
}

/// `HEAD` of a `GET`-priced path is a 402 unpaid (the handler, routed for every method, never
/// runs); `OPTIONS` is answered by the binding.
async fn stipendex_head_is_priced(h: &dyn Harness) -> Verdict {
    let sv = served(h, None, None).await?;
    let before = balances(h).await?;
    let (status, text) = raw(&sv.base, "HEAD", "/paid").await?;
    ensure!(status == 402, "HEAD /paid answered {status}: {text}");
    let (status, text) = raw(&sv.base, "OPTIONS", "/paid").await?;
    ensure!(status == 204, "OPTIONS /paid answered {status}: {text}");
    ensure!(sv.ran() == 0, "the priced handler ran for HEAD or OPTIONS");
    unchanged(h, before, "HEAD and OPTIONS").await
}

/// Every other spelling of a priced path is priced as it (percent-encoded, another case, a
/// trailing slash: 402 unpaid) or refused before any decision (`//`, `.` and `..` raw and
/// encoded, an encoded `/` or `\`, a `;`, `%00`, an invalid escape, an escape of an escape, a
/// method in lower case: 400) — never the priced handler's work.
async fn stipendex_encoded_path_is_priced(h: &dyn Harness) -> Verdict {
    let sv = served(h, None, None).await?;
    let before = balances(h).await?;
    for (method, path, want) in [
        ("GET", "/p%61id", 402),
        ("GET", "/%70%61%69%64", 402),
        ("GET", "/PAID", 402),
        ("GET", "/Paid/", 402),
        ("GET", "//paid", 400),
        ("GET", "/x/../paid", 400),
        ("GET", "/%2e%2e/paid", 400),
        ("GET", "/./paid", 400),
        ("GET", "/x%2Fpaid", 400),
        ("GET", "/x%5Cpaid", 400),
        ("GET", "/paid;v=1", 400),
        ("GET", "/paid%3B", 400),
        ("GET", "/paid%00", 400),
        ("GET", "/paid%zz", 400),
        ("GET", "/paid%252F", 400),
        ("get", "/paid", 400),
    ] {
        let (status, text) = raw(&sv.base, method, path).await?;
        ensure!(
            status == want,
            "{method} {path} answered {status}, not {want}: {text}"
        );
        ensure!(
            !text.contains("PAID WORK"),
            "{method} {path} was served unpaid"
        );
    }
    ensure!(sv.ran() == 0, "the priced handler ran");
    unchanged(h, before, "another spelling of a priced path").await
}

/// A checkout Proof whose Confirmation consents to less than the Quote's maximum is refused
/// by `accept` (before any work): the capture would fail after it. The honest Proof of the
/// same hold is accepted and captured.
async fn stipendex_checkout_confirmation_below_quote_refused(h: &dyn Harness) -> Verdict {
    use stipendex::envelope::{Confirmation, Proof, new_id};
    let sc = scene(h, &Options::default())?;
    let req = Request::new("POST", "/checkout");
    let q = quote(&sc, &req).await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("hold"))?;
    let honest = paid
        .confirmation
        .as_ref()
        .ok_or("a checkout must be confirmed")?
        .object()
        .clone();
    let low = Signed::sign(
        Confirmation {
            id: new_id("c_"),
            total: money(h, 1)?.amount(),
            tolerance: rail_core::Amount::ZERO,
            ..honest
        },
        &sc.wallet_key,
    )
    .map_err(s("confirmation"))?;
    let forged = Signed::sign(
        Proof {
            id: new_id("p_"),
            confirmation: Some(low.digest().clone()),
            confirmation_jws: Some(low.jws().to_owned()),
            ..paid.proof.object().clone()
        },
        &sc.wallet_key,
    )
    .map_err(s("proof"))?;
    let before = balances(h).await?;
    refused(
        "a confirmation below the quote",
        sc.receiver.accept(&req, forged.jws()).await,
        "not_confirmed",
    )?;
    unchanged(h, before, "a refused checkout").await?;
    let accepted = sc
        .receiver
        .accept(&req, paid.proof.jws())
        .await
        .map_err(s("accept the honest proof"))?;
    let final_amount = money(h, PRICE - 25)?;
    sc.receiver
        .capture(&accepted, &final_amount, b"order")
        .await
        .map_err(s("capture"))?;
    Ok(())
}

/// `GET url` with the Proof header `proof` (none: unpaid): status, Receipt header, body.
async fn presented(
    url: &str,
    proof: Option<&str>,
) -> Result<(u16, Option<String>, String), String> {
    let http = stipendex::http::reqwest_client(Duration::from_secs(30)).map_err(s("client"))?;
    let mut req = http.get(url);
    if let Some(p) = proof {
        req = req.header(stipendex::http::PAYMENT, p);
    }
    let r = req.send().await.map_err(s("send"))?;
    let receipt = r
        .headers()
        .get(stipendex::http::RECEIPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((
        r.status().as_u16(),
        receipt,
        r.text().await.map_err(s("body"))?,
    ))
}

/// The answer to a paid request is lost on the way; the wallet presents the same Proof again
/// for the same request and gets the same answer and Receipt — the handler runs once, the
/// price moves once. The same Proof for another request is a mismatch.
async fn stipendex_lost_answer_replayed(h: &dyn Harness) -> Verdict {
    let sv = served(h, None, None).await?;
    let before = balances(h).await?;
    let url = format!("{}/paid?q=lost", sv.base);
    let (status, _, body) = presented(&url, None).await?;
    ensure!(
        status == 402,
        "the unpaid request answered {status}: {body}"
    );
    let body: serde_json::Value = serde_json::from_str(&body).map_err(s("402 body"))?;
    let quote: Signed<stipendex::envelope::Quote> =
        serde_json::from_value(body.get("quote").cloned().unwrap_or_default())
            .map_err(s("402 quote"))?;
    let sent = quote
        .object()
        .resource
        .clone()
        .ok_or("the quote names no resource")?;
    let paid = sv
        .sc
        .wallet
        .pay_for(&quote, &sent)
        .await
        .map_err(s("pay"))?;
    let header = paid.proof.to_header();
    let first = presented(&url, Some(&header)).await?;
    ensure!(
        first.0 == 200 && first.1.is_some() && first.2 == "PAID WORK",
        "the paid request answered {} ({})",
        first.0,
        first.2
    );
    let again = presented(&url, Some(&header)).await?;
    ensure!(
        again == first,
        "the same proof again answered {} ({}), not the first answer",
        again.0,
        again.2
    );
    ensure!(sv.ran() == 1, "the handler ran {} times", sv.ran());
    let other = presented(&format!("{}/paid?q=other", sv.base), Some(&header)).await?;
    ensure!(
        other.0 == 402 && other.2.contains("\"mismatch\""),
        "the proof for another request answered {} ({})",
        other.0,
        other.2
    );
    ensure!(sv.ran() == 1, "the handler ran for another request");
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sv.sc.price),
        "one payment presented twice moved {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&sv.sc.price)
    );
    Ok(())
}

/// A Proof paid while its Quote was live and presented after the Quote's expiry (its answer
/// was lost, the payment waited for review): where the money moved at payment it is honoured —
/// accepted, the price moved once — or, on a rail that gives an expired offer's payment back,
/// refused with the payer's money back; where the money moves at verification it is refused
/// and nothing moves. Never refused while the money stays moved. Past the grace, refused.
async fn stipendex_proof_after_quote_expiry_honoured(h: &dyn Harness) -> Verdict {
    let sc = scene(h, &Options::default())?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("pay"))?;
    let now = u64::try_from(h.clock().now().unix_seconds()).map_err(s("clock"))?;
    h.clock()
        .advance(Duration::from_secs(q.object().exp.saturating_sub(now) + 1));
    let late = sc.receiver.accept(&paid_req(), paid.proof.jws()).await;
    let after = balances(h).await?;
    let moved = after.payee_settled - before.payee_settled;
    match (h.rail().capabilities().pay_effect, late) {
        (_, Ok(_)) => ensure!(
            moved == units(&sc.price),
            "the late proof was honoured but {moved} moved instead of {}",
            units(&sc.price)
        ),
        (PayEffect::SignsOnly, Err(e)) if e.code() == "expired" => {
            unchanged(h, before, "a late authorisation").await?;
        }
        (PayEffect::Moves, Err(e)) if e.code() == "expired" => ensure!(
            after.payer_available == before.payer_available && moved == 0,
            "a payment made in time was refused late ({e}) and its money stayed moved: {before:?} -> {after:?}"
        ),
        (_, Err(e)) => return Err(format!("the late proof: {} ({e})", e.code())),
    }
    // Past the grace nothing is honoured.
    let q = quote(
        &sc,
        &Request::new("GET", "/paid").with_params(serde_json::json!({"late": 1})),
    )
    .await?;
    let paid = sc.wallet.pay(&q).await.map_err(s("pay"))?;
    h.clock()
        .advance(rail_core::LATE_PROOF_GRACE + Duration::from_secs(300));
    refused(
        "a proof past the grace",
        sc.receiver
            .accept(
                &Request::new("GET", "/paid").with_params(serde_json::json!({"late": 1})),
                paid.proof.jws(),
            )
            .await,
        "expired",
    )
}

/// A payer whose first payment is made on the rail and whose answer is then lost: the wallet
/// hears `unavailable` (a timeout after the rail acted).
struct LosesFirstAnswer {
    inner: Arc<dyn rail_core::Payer>,
    lost: AtomicBool,
}

impl rail_core::Rail for LosesFirstAnswer {
    fn id(&self) -> rail_core::RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> rail_core::Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait::async_trait]
impl rail_core::Payer for LosesFirstAnswer {
    async fn pay(
        &self,
        op: &rail_core::OpId,
        offer: &rail_core::Offer,
    ) -> rail_core::RailResult<rail_core::Payment> {
        let payment = self.inner.pay(op, offer).await?;
        if self.lost.swap(true, Ordering::SeqCst) {
            return Ok(payment);
        }
        Err(rail_core::RailError::Unavailable(
            rail_core::RailReason::new("timeout", "the rail's answer was lost"),
        ))
    }
    fn accepts(&self, offer: &rail_core::Offer) -> rail_core::RailResult<()> {
        self.inner.accepts(offer)
    }
}

/// A payment made on the rail whose answer the wallet lost stays pending (listed, counted, its
/// Quote journaled before paying); `Wallet::resume` asks the rail again under the same
/// operation and signs the Proof once; the receiver accepts it, the chain verifies, and the
/// price moved once.
async fn stipendex_pending_payment_resumed(h: &dyn Harness) -> Verdict {
    let sc = scene(
        h,
        &Options {
            lose_first_answer: true,
            ..Options::default()
        },
    )?;
    let before = balances(h).await?;
    let q = quote(&sc, &paid_req()).await?;
    refused(
        "the payment whose answer is lost",
        sc.wallet.pay(&q).await,
        "unavailable",
    )?;
    let pending = sc.wallet.pending().await.map_err(s("pending"))?;
    let chain = chain_name("conformance-shop", &q.object().id);
    ensure!(
        pending.len() == 1 && pending.first().is_some_and(|p| p.chain == chain),
        "{} payments pending, expected this quote's",
        pending.len()
    );
    let paid = sc.wallet.resume(&chain).await.map_err(s("resume"))?;
    let again = sc.wallet.resume(&chain).await;
    refused("resuming a finished payment", again, "not_pending")?;
    let repaid = sc.wallet.pay(&q).await.map_err(s("pay again"))?;
    ensure!(
        !repaid.fresh && repaid.proof.jws() == paid.proof.jws(),
        "the resumed quote paid again gave another proof"
    );
    let accepted = sc
        .receiver
        .accept(&paid_req(), paid.proof.jws())
        .await
        .map_err(s("accept"))?;
    let receipt = sc
        .receiver
        .receipt(&accepted, b"PAID WORK")
        .map_err(s("receipt"))?;
    sc.wallet
        .receipt(&paid, receipt.jws())
        .await
        .map_err(s("wallet receipt"))?;
    let objects = sc.journal.chain(&chain);
    let refs: Vec<&str> = objects.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&refs, Some(&sc.principal.public()))
        .map_err(s("the resumed chain"))?;
    ensure!(
        objects.len() == 4,
        "the chain holds {} objects, not 4",
        objects.len()
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sc.price)
            && before.payer_available - after.payer_available == units(&sc.price),
        "a payment resumed once moved {before:?} -> {after:?}, not the price once"
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Tab sessions (`docs/stipendex-profile.md` §4b).

/// A scene whose receiver offers tabs of `cap` (minor units) at [`TAB_ORIGIN`].
fn tab_scene(h: &dyn Harness, cap: u128, total: u128) -> Result<Scene, String> {
    scene(
        h,
        &Options {
            origins: vec![TAB_ORIGIN.to_owned()],
            tab_cap: Some(cap),
            offer_tabs: true,
            total,
            ..Options::default()
        },
    )
}

/// The call `GET /paid?n=<n>` at [`TAB_ORIGIN`].
fn tab_req(n: u32) -> Request {
    Request::from_resource(&stipendex::envelope::Resource {
        origin: TAB_ORIGIN.into(),
        method: "GET".into(),
        path: "/paid".into(),
        query: Some(format!("n={n}")),
    })
}

/// A tab offered for `GET /paid`, held by the wallet and opened at the receiver.
async fn tab_opened(sc: &Scene) -> Result<stipendex::wallet::TabHold, String> {
    let req = tab_req(0);
    let tab = sc
        .receiver
        .offer_tab(&req)
        .await
        .map_err(s("offer a tab"))?
        .ok_or("the receiver offers no tab")?;
    let sent = req.resource().ok_or("no resource")?;
    let hold = sc
        .wallet
        .open_tab(&tab, &sent)
        .await
        .map_err(s("hold the tab"))?;
    sc.receiver
        .open_tab(hold.proof().jws())
        .await
        .map_err(s("open the tab"))?;
    Ok(hold)
}

/// One call inside the tab, answered; its voucher.
async fn tab_called(
    sc: &Scene,
    hold: &stipendex::wallet::TabHold,
    n: u32,
) -> Result<Signed<stipendex::envelope::Voucher>, String> {
    use stipendex::receiver::TabCall;
    let req = tab_req(n);
    let v = sc.wallet.voucher(hold, &req).await.map_err(s("voucher"))?;
    match sc
        .receiver
        .tab_call(&req, v.voucher.jws())
        .await
        .map_err(s("tab call"))?
    {
        TabCall::Run(serving) => {
            // The wallet journals the result it received, as its clients do.
            sc.wallet
                .tab_result(
                    hold,
                    &v.voucher,
                    &stipendex::envelope::Digest::of(format!("result {n}").as_bytes()),
                )
                .await
                .map_err(s("journal the call's result"))?;
            sc.receiver
                .tab_answered(
                    *serving,
                    stipendex::receiver::Answer {
                        status: 200,
                        content_type: None,
                        body: format!("result {n}").into_bytes(),
                        receipt: None,
                        headers: Vec::new(),
                    },
                    &stipendex::envelope::Digest::of(format!("result {n}").as_bytes()),
                )
                .await;
        }
        TabCall::Answered { .. } => return Err("a new voucher got a kept answer".into()),
        TabCall::Waived { .. } => return Err("a list-priced call was waived".into()),
    }
    Ok(v.voucher.clone())
}

/// Closes the tab at the wallet's request; the wallet checks the Receipt.
async fn tab_closed(
    sc: &Scene,
    hold: &stipendex::wallet::TabHold,
) -> Result<Signed<stipendex::envelope::TabReceipt>, String> {
    let close = sc.wallet.close_request(hold).map_err(s("close request"))?;
    let receipt = sc
        .receiver
        .close_tab(close.jws())
        .await
        .map_err(s("close the tab"))?;
    sc.wallet
        .tab_closed(hold, receipt.jws())
        .await
        .map_err(s("the wallet's check of the tab's receipt"))
}

async fn stipendex_tab_capture_is_last_voucher(h: &dyn Harness) -> Verdict {
    let sc = tab_scene(h, PRICE * 8, PRICE * 20)?;
    let before = balances(h).await?;
    let hold = tab_opened(&sc).await?;
    for n in 1..=3 {
        tab_called(&sc, &hold, n).await?;
    }
    let receipt = tab_closed(&sc, &hold).await?;
    let r = receipt.object();
    let three = money(h, PRICE * 3)?;
    ensure!(
        r.captured == three.amount() && r.calls == 3,
        "the tab captured {} for {} calls; its last vouchers add up to {three} for 3",
        r.captured,
        r.calls
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&three)
            && before.payer_available - after.payer_available == units(&three),
        "a tab of 3 calls moved {before:?} -> {after:?}, not exactly their price"
    );
    Ok(())
}

async fn stipendex_tab_voucher_replay_refused(h: &dyn Harness) -> Verdict {
    use stipendex::receiver::TabCall;
    let sc = tab_scene(h, PRICE * 8, PRICE * 20)?;
    let before = balances(h).await?;
    let hold = tab_opened(&sc).await?;
    let first = tab_called(&sc, &hold, 1).await?;
    // The same voucher again: its kept answer, not a second call.
    match sc.receiver.tab_call(&tab_req(1), first.jws()).await {
        Ok(TabCall::Answered { .. }) => {}
        Ok(TabCall::Run(_) | TabCall::Waived { .. }) => {
            return Err("the same voucher ran twice".into());
        }
        Err(e) => return Err(format!("the same voucher again: {e}")),
    }
    // Another voucher with that lane's used sequence: equivocation, and the tab closes.
    let mut other = first.object().clone();
    other.id = stipendex::envelope::new_id("v_");
    let other = Signed::sign(other, &sc.wallet_key).map_err(s("voucher"))?;
    refused(
        "another voucher with a used sequence",
        sc.receiver.tab_call(&tab_req(1), other.jws()).await,
        "equivocation",
    )?;
    refused(
        "a call after the tab was closed for equivocation",
        sc.receiver.tab_call(&tab_req(1), first.jws()).await,
        "tab_closed",
    )?;
    let receipt = tab_closed(&sc, &hold).await?;
    ensure!(
        receipt.object().captured == sc.price.amount(),
        "captured {} for one honest call of {}",
        receipt.object().captured,
        sc.price
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sc.price),
        "replays moved {before:?} -> {after:?}, not one call's price"
    );
    Ok(())
}

async fn stipendex_tab_above_cap_refused(h: &dyn Harness) -> Verdict {
    let sc = tab_scene(h, PRICE * 2, PRICE * 20)?;
    let before = balances(h).await?;
    let hold = tab_opened(&sc).await?;
    let v1 = tab_called(&sc, &hold, 1).await?;
    tab_called(&sc, &hold, 2).await?;
    refused(
        "the wallet signing above the cap",
        sc.wallet.voucher(&hold, &tab_req(3)).await,
        "above_cap",
    )?;
    // Signed anyway (on the other lane's next sequence): the receiver refuses it.
    let mut over = v1.object().clone();
    let req = tab_req(3);
    over.id = stipendex::envelope::new_id("v_");
    over.lane = 1 - over.lane;
    over.seq = 2;
    over.cumulative = money(h, PRICE * 2)?.amount();
    over.request = req.digest();
    over.resource = req.resource().ok_or("no resource")?;
    let over = Signed::sign(over, &sc.wallet_key).map_err(s("voucher"))?;
    let r = sc.receiver.tab_call(&req, over.jws()).await;
    match &r {
        Err(e)
            if matches!(
                e.code(),
                "above_cap" | "voucher_out_of_order" | "bad_cumulative"
            ) => {}
        _ => refused("a voucher above the cap", r, "above_cap")?,
    }
    let receipt = tab_closed(&sc, &hold).await?;
    let cap = money(h, PRICE * 2)?;
    ensure!(
        receipt.object().captured == cap.amount(),
        "captured {}, not the cap {cap} its two calls used",
        receipt.object().captured
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&cap),
        "a tab at its cap moved {before:?} -> {after:?}"
    );
    Ok(())
}

async fn stipendex_tab_close_releases_rest(h: &dyn Harness) -> Verdict {
    // A total of 10 prices: a tab of 8 held, one call made; closed, the 7 unused go back to
    // the limits (and the payer), so a second tab of 8 fits (1 + 8 <= 10).
    let sc = tab_scene(h, PRICE * 8, PRICE * 10)?;
    let before = balances(h).await?;
    let hold = tab_opened(&sc).await?;
    tab_called(&sc, &hold, 1).await?;
    let held = balances(h).await?;
    ensure!(
        before.payer_available - held.payer_available >= units(&money(h, PRICE * 8)?),
        "the cap is not held: {before:?} -> {held:?}"
    );
    tab_closed(&sc, &hold).await?;
    let after = balances(h).await?;
    ensure!(
        before.payer_available - after.payer_available == units(&sc.price)
            && after.payee_settled - before.payee_settled == units(&sc.price),
        "closing after one call moved {before:?} -> {after:?}: the rest of the cap was not released"
    );
    let second = tab_opened(&sc)
        .await
        .map_err(|e| format!("the rest of the cap did not go back to the limits: {e}"))?;
    tab_closed(&sc, &second).await?;
    Ok(())
}

async fn stipendex_tab_refused_without_partial_capture(h: &dyn Harness) -> Verdict {
    use stipendex::envelope::{RailOffer, Tab, TabPrice, Tag, new_id};
    let caps = h.rail().capabilities();
    if caps.hold && caps.partial_capture {
        return Err(
            "skip: this rail holds and captures part of a hold (the tab behaviours run on it)"
                .into(),
        );
    }
    // The receiver: tabs on this rail are a configuration error naming why.
    match tab_scene(h, PRICE * 8, PRICE * 20) {
        Err(e) if e.contains("captures part of a hold") => {}
        Err(e) => {
            return Err(format!(
                "a receiver offering tabs here failed otherwise: {e}"
            ));
        }
        Ok(_) => {
            return Err(
                "a receiver offers tabs on a rail that cannot capture part of a hold".into(),
            );
        }
    }
    // The wallet: a tab whose only rail is this one (a receiver elsewhere signed it) is
    // refused with a clear error, and nothing moves.
    // The mandate allows tabs (its policy is not what refuses) and pins the receiver: the rail
    // is what cannot hold the tab.
    let sc = scene(
        h,
        &Options {
            origins: vec![TAB_ORIGIN.to_owned()],
            tab_cap: Some(PRICE * 8),
            ..Options::default()
        },
    )?;
    let cap = money(h, PRICE * 8)?;
    let mut charge = rail_core::Charge::capture(cap.clone(), Duration::from_secs(600));
    charge.reference = Some(new_id("t_"));
    let mut offer = h
        .rail()
        .receiver
        .offer(&charge)
        .await
        .map_err(s("the rail's offer"))?;
    offer.mode = rail_core::PaymentMode::Hold;
    let now = u64::try_from(h.clock().now().unix_seconds()).map_err(s("clock"))?;
    let tab = Signed::sign(
        Tab {
            stipendex: Tag::current("tab"),
            id: new_id("t_"),
            receiver: sc.receiver.party().clone(),
            origin: TAB_ORIGIN.into(),
            iat: now,
            exp: now + 600,
            asset: h.asset(),
            cap: cap.amount(),
            prices: vec![TabPrice {
                method: "GET".into(),
                pattern: "/paid".into(),
                amount: sc.price.amount(),
            }],
            lanes: 2,
            rails: vec![RailOffer {
                rail: offer.rail.as_str().to_owned(),
                offer,
            }],
        },
        &sc.receiver_key,
    )
    .map_err(s("tab"))?;
    let before = balances(h).await?;
    let sent = tab_req(0).resource().ok_or("no resource")?;
    refused(
        "a tab on a rail without partial capture",
        sc.wallet.open_tab(&tab, &sent).await,
        "no_rail",
    )?;
    unchanged(h, before, "a refused tab").await
}

// ---- No free work, no charge without service (issue 44): on every rail. --------------------

/// The unpaid 402's Quote for `url`, paid by the scene's wallet: the Proof's header.
async fn paid_proof(sv: &Served, url: &str) -> Result<String, String> {
    let (status, _, body) = presented(url, None).await?;
    ensure!(
        status == 402,
        "the unpaid request answered {status}: {body}"
    );
    let body: serde_json::Value = serde_json::from_str(&body).map_err(s("402 body"))?;
    let quote: Signed<stipendex::envelope::Quote> =
        serde_json::from_value(body.get("quote").cloned().unwrap_or_default())
            .map_err(s("402 quote"))?;
    let sent = quote
        .object()
        .resource
        .clone()
        .ok_or("the quote names no resource")?;
    let paid = sv
        .sc
        .wallet
        .pay_for(&quote, &sent)
        .await
        .map_err(s("pay"))?;
    Ok(paid.proof.to_header())
}

/// Whether the rail holds and captures part of a hold (tabs run on it).
fn tabs_run_on(h: &dyn Harness) -> bool {
    let caps = h.rail().capabilities();
    caps.hold && caps.partial_capture
}

/// The options of a receiver served over HTTP that offers tabs where the rail can.
fn with_tabs(h: &dyn Harness, o: Options) -> Options {
    if tabs_run_on(h) {
        Options {
            tab_cap: Some(PRICE * 8),
            offer_tabs: true,
            ..o
        }
    } else {
        o
    }
}

/// While the work behind the receiver is away, every way to pay passes its one guard and
/// nothing is taken: a Proof is refused (503) before it is claimed and served once the work is
/// back; where the rail holds, a tab's opening and a voucher are refused uncounted, and the
/// tab's close captures the calls served, and only those.
async fn stipendex_unready_work_takes_nothing(h: &dyn Harness) -> Verdict {
    let away = Arc::new(Away::default());
    let sv = served_with(
        h,
        None,
        None,
        with_tabs(
            h,
            Options {
                ready: Some(away.clone()),
                ..Options::default()
            },
        ),
    )
    .await?;
    let before = balances(h).await?;
    let url = format!("{}/paid?q=proof", sv.base);
    let proof = paid_proof(&sv, &url).await?;
    away.set(true);
    let (status, _, body) = presented(&url, Some(&proof)).await?;
    ensure!(
        status == 503 && body.contains("upstream_unavailable"),
        "a Proof while the work is away answered {status}: {body}"
    );
    ensure!(sv.ran() == 0, "the priced handler ran");
    away.set(false);
    let (status, receipt, _) = presented(&url, Some(&proof)).await?;
    ensure!(
        status == 200 && receipt.is_some(),
        "the same Proof once the work is back answered {status}"
    );
    ensure!(sv.ran() == 1, "the handler ran {} times", sv.ran());
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sv.sc.price),
        "one Proof, held back once, moved {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&sv.sc.price)
    );
    if !tabs_run_on(h) {
        return Ok(());
    }
    let client = sv.client()?;
    let get = |n: &str| {
        let (client, url) = (&client, format!("{}/paid?n={n}", sv.base));
        async move { client.get(&url).await.map_err(s("a call in a tab")) }
    };
    // The tab's opening (its hold Proof, with the first voucher) while away: not opened.
    away.set(true);
    let r = get("1").await?;
    ensure!(
        r.status == 503 && r.tab_call.is_none(),
        "a tab's opening while away answered {} (paid: {})",
        r.status,
        r.tab_call.is_some()
    );
    ensure!(
        sv.sc.receiver.tabs_cached() == 0,
        "an unopened tab was kept"
    );
    away.set(false);
    let r = get("2").await?;
    ensure!(
        r.tab_call.is_some(),
        "the tab did not pay once the work was back"
    );
    // A voucher while away: not counted.
    away.set(true);
    let r = get("3").await?;
    ensure!(
        r.status == 503 && r.tab_call.is_none(),
        "a voucher while away answered {} (paid: {})",
        r.status,
        r.tab_call.is_some()
    );
    away.set(false);
    let r = get("4").await?;
    ensure!(
        r.tab_call.is_some(),
        "the tab did not go on after the work was back"
    );
    let receipts = client.close_tabs().await.map_err(s("close"))?;
    let receipt = receipts.last().ok_or("no tab closed")?.object();
    ensure!(
        receipt.calls == 2 && receipt.captured == money(h, PRICE * 2)?.amount(),
        "the tab captured {} for {} calls; 2 were served",
        receipt.captured,
        receipt.calls
    );
    ensure!(sv.ran() == 3, "the handler ran {} times", sv.ran());
    Ok(())
}

/// Paid work that never reached the service behind the receiver (its answer marked
/// `Undelivered`) is kept as no answer and charges nothing: the same Proof later runs the
/// request once, with its Receipt; where the rail holds, the voucher is taken back and the
/// next one carries its sequence.
async fn stipendex_undelivered_work_charges_nothing(h: &dyn Harness) -> Verdict {
    let sv = served_with(h, None, None, with_tabs(h, Options::default())).await?;
    let before = balances(h).await?;
    let url = format!("{}/paid?q=undelivered", sv.base);
    let proof = paid_proof(&sv, &url).await?;
    sv.undelivered.store(true, Ordering::SeqCst);
    let (status, receipt, body) = presented(&url, Some(&proof)).await?;
    ensure!(
        status == 503 && receipt.is_none(),
        "undelivered work answered {status}: {body}"
    );
    sv.undelivered.store(false, Ordering::SeqCst);
    let (status, receipt, body) = presented(&url, Some(&proof)).await?;
    ensure!(
        status == 200 && receipt.is_some() && body == "PAID WORK",
        "the same Proof after undelivered work answered {status}: {body}"
    );
    ensure!(sv.ran() == 1, "the handler ran {} times", sv.ran());
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == units(&sv.sc.price),
        "moved {} instead of {}",
        after.payee_settled - before.payee_settled,
        units(&sv.sc.price)
    );
    if !tabs_run_on(h) {
        return Ok(());
    }
    let client = sv.client()?;
    let get = |n: &str| {
        let (client, url) = (&client, format!("{}/paid?n={n}", sv.base));
        async move { client.get(&url).await.map_err(s("a call in a tab")) }
    };
    ensure!(get("1").await?.tab_call.is_some(), "the tab did not pay");
    sv.undelivered.store(true, Ordering::SeqCst);
    let r = get("2").await?;
    ensure!(
        r.status == 503 && r.tab_call.is_none(),
        "an undelivered call in a tab answered {} (paid: {})",
        r.status,
        r.tab_call.is_some()
    );
    sv.undelivered.store(false, Ordering::SeqCst);
    ensure!(get("3").await?.tab_call.is_some(), "the tab did not go on");
    let receipts = client.close_tabs().await.map_err(s("close"))?;
    let receipt = receipts.last().ok_or("no tab closed")?.object();
    ensure!(
        receipt.calls == 2 && receipt.captured == money(h, PRICE * 2)?.amount(),
        "the tab captured {} for {} calls; 2 were served",
        receipt.captured,
        receipt.calls
    );
    Ok(())
}

/// A 3xx the paid work answers (a presigned download's redirect) is a delivered answer: it
/// carries its Receipt, and the payment stands once.
async fn stipendex_paid_redirect_receipted(h: &dyn Harness) -> Verdict {
    let sv = served(h, None, None).await?;
    let client = sv.client()?;
    let r = client
        .get(&format!("{}/paid?q=redirect", sv.base))
        .await
        .map_err(s("a paid redirect"))?;
    ensure!(
        r.status.is_redirection() && r.receipt.is_some(),
        "a paid redirect answered {} (receipt: {})",
        r.status,
        r.receipt.is_some()
    );
    ensure!(sv.ran() == 1, "the handler ran {} times", sv.ran());
    Ok(())
}

/// The price hook runs for every call inside a tab: a refusal (`rejected`) and a waiver take
/// nothing — the wallet gives the voucher's lane back —, a price other than the tab's is
/// `wrong_price`; the close captures the calls the tab paid, and only those.
async fn stipendex_tab_hook_runs_for_every_call(h: &dyn Harness) -> Verdict {
    use stipendex::receiver::{Decision, Price, TabCall};
    let dear = money(h, PRICE * 2)?;
    let hook = move |cap: &PricedCapability, req: &Request| match req
        .params
        .get("n")
        .and_then(serde_json::Value::as_str)
    {
        Some("blocked") => Decision::reject("not served"),
        Some("free") => Decision::Waive,
        Some("dear") => Decision::quote(Price::Fixed(dear.clone())),
        _ => Decision::quote(cap.price.clone()),
    };
    let sc = scene(
        h,
        &Options {
            origins: vec![TAB_ORIGIN.to_owned()],
            tab_cap: Some(PRICE * 8),
            offer_tabs: true,
            total: PRICE * 20,
            hook: Some(Arc::new(hook)),
            ..Options::default()
        },
    )?;
    let hold = tab_opened(&sc).await?;
    tab_called(&sc, &hold, 1).await?;
    let at = |n: &str| {
        Request::from_resource(&stipendex::envelope::Resource {
            origin: TAB_ORIGIN.into(),
            method: "GET".into(),
            path: "/paid".into(),
            query: Some(format!("n={n}")),
        })
    };
    for (n, want) in [
        ("blocked", "rejected"),
        ("free", "waived"),
        ("dear", "wrong_price"),
    ] {
        let v = sc
            .wallet
            .voucher(&hold, &at(n))
            .await
            .map_err(s("voucher"))?;
        let got = match sc.receiver.tab_call(&at(n), v.voucher.jws()).await {
            Ok(TabCall::Waived { .. }) => "waived".to_owned(),
            Ok(_) => "run".to_owned(),
            Err(e) => e.code().to_owned(),
        };
        ensure!(got == want, "the call n={n} was {got}, not {want}");
        sc.wallet
            .voucher_uncounted(&v)
            .await
            .map_err(s("give the lane back"))?;
    }
    let last = tab_called(&sc, &hold, 2).await?;
    ensure!(
        last.object().seq == 2,
        "the lane was not given back: the next voucher has sequence {}",
        last.object().seq
    );
    let receipt = tab_closed(&sc, &hold).await?;
    ensure!(
        receipt.object().calls == 2 && receipt.object().captured == money(h, PRICE * 2)?.amount(),
        "the tab captured {} for {} calls; it paid 2",
        receipt.object().captured,
        receipt.object().calls
    );
    let lines = sc
        .journal
        .chain(&chain_name("conformance-shop", &hold.tab().object().id));
    stipendex::chain::verify_tab_chain(
        lines.iter().map(String::as_str),
        Some(&sc.principal.public()),
    )
    .map_err(s("the tab's chain"))?;
    Ok(())
}

/// A refused tab opening — a fresh tab sent back with a throwaway key and another tab's hold
/// — leaves nothing at the receiver, however many come; nothing moves.
async fn stipendex_tab_refused_opening_keeps_nothing(h: &dyn Harness) -> Verdict {
    let sc = tab_scene(h, PRICE * 8, PRICE * 20)?;
    let req = tab_req(0);
    let sent = req.resource().ok_or("no resource")?;
    let tab = sc
        .receiver
        .offer_tab(&req)
        .await
        .map_err(s("offer a tab"))?
        .ok_or("the receiver offers no tab")?;
    let hold = sc
        .wallet
        .open_tab(&tab, &sent)
        .await
        .map_err(s("hold the tab"))?;
    let before = balances(h).await?;
    for _ in 0..50 {
        let fresh = sc
            .receiver
            .offer_tab(&req)
            .await
            .map_err(s("offer a tab"))?
            .ok_or("the receiver offers no tab")?;
        let key = SecretKey::generate();
        let mut p = hold.proof().object().clone();
        p.id = stipendex::envelope::new_id("p_");
        p.wallet = key.public();
        p.tab = Some(fresh.digest().clone());
        p.tab_jws = Some(fresh.jws().to_owned());
        let forged = Signed::sign(p, &key).map_err(s("proof"))?;
        ensure!(
            sc.receiver.open_tab(forged.jws()).await.is_err(),
            "a forged tab opening was accepted"
        );
    }
    ensure!(
        sc.receiver.tabs_cached() == 0,
        "{} refused openings were kept",
        sc.receiver.tabs_cached()
    );
    unchanged(h, before, "refused tab openings").await
}

macro_rules! behaviours {
    ($( $f:ident : $needs:ident => $about:literal ),* $(,)?) => {
        /// The Stipendex behaviours, in run order.
        #[must_use]
        pub fn all() -> Vec<Behaviour<dyn StipendexHarness>> {
            vec![$(Behaviour {
                name: stringify!($f),
                about: $about,
                needs: Needs::$needs,
                run: |h| -> BoxFuture<'_, Verdict> { Box::pin($f(h)) },
            }),*]
        }
    };
}

behaviours! {
    stipendex_receipt_chain_verifies: Pay => "Stipendex: quote, pay under a mandate, receipt; the chain verifies offline (I5)",
    stipendex_allowlist_denial: Pay => "Stipendex: a receiver outside the allowlist is denied; nothing moves (I4)",
    stipendex_limit_exceeded: Pay => "Stipendex: a payment above the mandate's limit is refused; nothing moves",
    stipendex_revoked_mandate: Pay => "Stipendex: a revoked mandate pays nothing",
    stipendex_hitl_required: Pay => "Stipendex: above the threshold the human decides; a no moves nothing",
    stipendex_expired_quote: Pay => "Stipendex: an expired quote is not paid (I2)",
    stipendex_quote_reuse: Pay => "Stipendex: a quote paid twice returns its first proof and charges once (I2)",
    stipendex_proof_replay: Pay => "Stipendex: a replayed proof is refused and charges nothing (I2)",
    stipendex_capture_above_confirmed_refused: PartialCapture => "Stipendex checkout: a capture above the quote or the confirmation is refused (I3)",
    stipendex_tampered_chain_detected: Pay => "Stipendex: a tampered or foreign link breaks the chain where it is",
    stipendex_x402_402_paid_under_mandate: Pay => "Stipendex: a plain x402 402 is paid under the mandate (origin + payTo allowlist); unlisted, denied",
    stipendex_relayed_quote_refused: Pay => "Stipendex over HTTP: a quote relayed from another origin or request is denied; nothing moves",
    stipendex_redirect_carries_no_payment: Pay => "Stipendex over HTTP: no payment header follows a redirect to another origin",
    stipendex_head_is_priced: Pay => "Stipendex over HTTP: HEAD of a priced GET is 402 unpaid; OPTIONS never reaches the handler",
    stipendex_encoded_path_is_priced: Pay => "Stipendex over HTTP: every spelling of a priced path is priced (402) or refused before any decision (400); none is served unpaid",
    stipendex_unready_work_takes_nothing: Pay => "Stipendex over HTTP: while the work is away every way to pay (proof, tab opening, voucher) passes the one guard and nothing is taken",
    stipendex_undelivered_work_charges_nothing: Pay => "Stipendex over HTTP: work that never reached the service is kept as no answer; the proof runs once later, a voucher is taken back",
    stipendex_paid_redirect_receipted: Pay => "Stipendex over HTTP: a paid 3xx is a delivered answer with its receipt",
    stipendex_checkout_confirmation_below_quote_refused: PartialCapture => "Stipendex checkout: a confirmation below the quote's maximum is refused before the work",
    stipendex_proof_after_quote_expiry_honoured: Pay => "Stipendex: a proof paid in time and presented after the quote's expiry is honoured (or its money given back); never refused with the money kept",
    stipendex_pending_payment_resumed: Pay => "Stipendex: a payment whose answer was lost stays pending and counted; resume signs its proof once; one charge, one chain",
    stipendex_lost_answer_replayed: Pay => "Stipendex over HTTP: the same proof again after a lost answer gets the same answer and receipt; one run, one charge",
    stipendex_tab_capture_is_last_voucher: PartialCapture => "Stipendex tabs: one hold, calls paid by vouchers, the close captures exactly the lanes' last vouchers",
    stipendex_tab_voucher_replay_refused: PartialCapture => "Stipendex tabs: the same voucher again gets its answer, another with a used sequence is equivocation (the tab closes); one charge per call",
    stipendex_tab_above_cap_refused: PartialCapture => "Stipendex tabs: a call above the cap is refused by the wallet and by the receiver; the capture is never above the cap",
    stipendex_tab_close_releases_rest: PartialCapture => "Stipendex tabs: the close releases the unused cap on the rail and gives it back to the mandate's limits",
    stipendex_tab_hook_runs_for_every_call: PartialCapture => "Stipendex tabs: the price hook runs for every call; a refusal or a waiver is not counted, another price is wrong_price",
    stipendex_tab_refused_opening_keeps_nothing: PartialCapture => "Stipendex tabs: a refused tab opening leaves nothing at the receiver; nothing moves",
    stipendex_tab_refused_without_partial_capture: Pay => "Stipendex tabs: on a rail that cannot hold and capture part of a hold, no tab is offered or held; nothing moves",
}
