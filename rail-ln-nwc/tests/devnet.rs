#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! The devnet driven by a plain nostr-sdk client and `rail_ln_nwc::wire` (no NwcClient).

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bitcoin::hashes::{Hash, sha256};
use lightning_invoice::{Bolt11Invoice, Currency, InvoiceBuilder, PaymentSecret};
use nostr_sdk::prelude::{
    Client, Event, EventBuilder, Filter, Keys, Kind, PublicKey, RelayMessage, RelayNotification,
    RelayOptions, RelayPoolNotification, RelayStatus, RelayUrl, SubscriptionId, Tag, TagKind,
    Timestamp,
};
use nwc_devnet::{ConnectionSpec, Devnet, DevnetConfig, Faults, METHODS, WalletSpec};
use rail_ln_nwc::nip47::{
    ConnectionUri, Encryption, ErrorCode, KIND_INFO, KIND_NOTIFICATION, KIND_NOTIFICATION_NIP04,
    KIND_REQUEST, KIND_RESPONSE, Notification, Request, Response, Transaction, TxState,
};
use rail_ln_nwc::wire;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;

const T: Duration = Duration::from_secs(10);

/// A bare NIP-47 app: one nostr client, any number of connection keys, an inbox of everything
/// addressed to them.
#[derive(Clone)]
struct App {
    client: Client,
    url: RelayUrl,
    sub: SubscriptionId,
    filter: Filter,
    inbox: Arc<Mutex<Vec<Event>>>,
    tick: Arc<watch::Sender<u64>>,
}

/// Sets one fault (`set`) on wallet `name`, the others off.
fn fault(devnet: &Devnet, name: &str, set: impl FnOnce(&mut Faults)) {
    let mut f = Faults::default();
    set(&mut f);
    devnet.set_faults(name, f).unwrap();
}

fn keys_of(uri: &ConnectionUri) -> Keys {
    Keys::parse(&uri.secret).unwrap()
}

fn wallet_pk(uri: &ConnectionUri) -> PublicKey {
    PublicKey::from_hex(&uri.wallet_pubkey).unwrap()
}

impl App {
    async fn new(url: &str, keys: &[Keys]) -> App {
        let url = RelayUrl::parse(url).unwrap();
        let client = Client::builder().build();
        client
            .pool()
            .add_relay(
                url.clone(),
                RelayOptions::new()
                    .retry_interval(Duration::from_millis(300))
                    .adjust_retry_interval(false),
            )
            .await
            .unwrap();
        client.connect().await;
        client.wait_for_connection(Duration::from_secs(5)).await;
        let filter = Filter::new()
            .kinds([
                Kind::from(KIND_RESPONSE),
                Kind::from(KIND_NOTIFICATION),
                Kind::from(KIND_NOTIFICATION_NIP04),
            ])
            .pubkeys(keys.iter().map(Keys::public_key));
        let app = App {
            client,
            url,
            sub: SubscriptionId::new("app"),
            filter,
            inbox: Arc::new(Mutex::new(Vec::new())),
            tick: Arc::new(watch::channel(0).0),
        };
        let mut rx = app.client.notifications();
        let (inbox, tick) = (app.inbox.clone(), app.tick.clone());
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(RelayPoolNotification::Event { event, .. }) => {
                        inbox.lock().unwrap().push(*event);
                        tick.send_modify(|t| *t += 1);
                    }
                    Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => break,
                    _ => {}
                }
            }
        });
        // Resubscribe on every reconnect (nostr-relay-pool 0.44 may skip it).
        let mut status = app
            .client
            .relay(app.url.clone())
            .await
            .unwrap()
            .notifications();
        let (c, sub, f) = (app.client.clone(), app.sub.clone(), app.filter.clone());
        tokio::spawn(async move {
            loop {
                match status.recv().await {
                    Ok(RelayNotification::RelayStatus {
                        status: RelayStatus::Connected,
                    }) => {
                        let _ = c.subscribe_with_id(sub.clone(), f.clone(), None).await;
                    }
                    Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => break,
                    _ => {}
                }
            }
        });
        app.subscribe_ready().await;
        app
    }

    async fn subscribe_ready(&self) {
        let mut rx = self.client.notifications();
        self.client
            .subscribe_with_id(self.sub.clone(), self.filter.clone(), None)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(RelayPoolNotification::Message {
                    message: RelayMessage::EndOfStoredEvents(sid),
                    ..
                }) = rx.recv().await
                    && *sid == self.sub
                {
                    break;
                }
            }
        })
        .await
        .expect("EOSE");
    }

    /// After a relay restart: reconnected and subscribed again.
    async fn ready(&self) {
        let relay = self.client.relay(self.url.clone()).await.unwrap();
        let t0 = Instant::now();
        while relay.status() != RelayStatus::Connected {
            assert!(t0.elapsed() < T, "app did not reconnect");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.subscribe_ready().await;
    }

    /// Waits for (and takes) the first inbox event matching `pred`.
    async fn take(&self, pred: impl Fn(&Event) -> bool, timeout: Duration) -> Option<Event> {
        let mut tick = self.tick.subscribe();
        tokio::time::timeout(timeout, async {
            loop {
                {
                    let mut inbox = self.inbox.lock().unwrap();
                    if let Some(i) = inbox.iter().position(&pred) {
                        return inbox.remove(i);
                    }
                }
                tick.changed().await.unwrap();
            }
        })
        .await
        .ok()
    }

    async fn publish(&self, ev: &Event) {
        let out = self.client.send_event(ev).await.unwrap();
        assert!(!out.success.is_empty(), "publish failed: {:?}", out.failed);
    }

    async fn send(
        &self,
        uri: &ConnectionUri,
        enc: Encryption,
        method: &str,
        params: Value,
    ) -> Event {
        let req = Request {
            method: method.into(),
            params,
        };
        let ev = wire::request_event(
            &keys_of(uri),
            &wallet_pk(uri),
            enc,
            &req,
            Duration::from_secs(60),
        )
        .unwrap();
        self.publish(&ev).await;
        ev
    }

    async fn response_event(&self, req: &Event, timeout: Duration) -> Option<Event> {
        let id = req.id;
        self.take(
            move |e| e.kind == Kind::from(KIND_RESPONSE) && e.tags.event_ids().any(|x| *x == id),
            timeout,
        )
        .await
    }

    /// The response to `req` (decrypted with the response's own `encryption` tag, the
    /// request's when absent), signed by the request's wallet.
    async fn response(&self, keys: &Keys, req: &Event, timeout: Duration) -> Option<Response> {
        let ev = self.response_event(req, timeout).await?;
        assert_eq!(Some(&ev.pubkey), req.tags.public_keys().next());
        assert!(ev.tags.public_keys().any(|p| *p == keys.public_key()));
        let enc = wire::encryption_tag(&ev)
            .flatten()
            .or(wire::encryption_tag(req).flatten())
            .unwrap_or(Encryption::Nip04);
        Some(wire::open(keys, &ev, enc).unwrap())
    }

    async fn call_enc(
        &self,
        uri: &ConnectionUri,
        enc: Encryption,
        method: &str,
        params: Value,
    ) -> Response {
        let req = self.send(uri, enc, method, params).await;
        let resp = self
            .response(&keys_of(uri), &req, T)
            .await
            .unwrap_or_else(|| panic!("no response to {method}"));
        assert_eq!(resp.result_type, method);
        resp
    }

    /// Sends `pay_invoice` of `invoice` (NIP-44) without waiting for its answer: the request.
    async fn send_pay(&self, uri: &ConnectionUri, invoice: &impl serde::Serialize) -> Event {
        self.send(
            uri,
            Encryption::Nip44V2,
            "pay_invoice",
            json!({ "invoice": invoice }),
        )
        .await
    }

    /// `pay_invoice` of `invoice` by `uri`'s wallet.
    async fn pay_invoice(&self, uri: &ConnectionUri, invoice: &impl serde::Serialize) -> Response {
        self.call(uri, "pay_invoice", json!({ "invoice": invoice }))
            .await
    }

    /// `settle_hold_invoice` with `preimage`.
    async fn settle_hold(&self, uri: &ConnectionUri, preimage: &impl serde::Serialize) -> Response {
        self.call(uri, "settle_hold_invoice", json!({ "preimage": preimage }))
            .await
    }

    /// `cancel_hold_invoice` of `hash`.
    async fn cancel_hold(&self, uri: &ConnectionUri, hash: &impl serde::Serialize) -> Response {
        self.call(uri, "cancel_hold_invoice", json!({ "payment_hash": hash }))
            .await
    }

    /// `lookup_invoice` by payment hash.
    async fn lookup(&self, uri: &ConnectionUri, hash: &impl serde::Serialize) -> Response {
        self.call(uri, "lookup_invoice", json!({ "payment_hash": hash }))
            .await
    }

    /// `make_hold_invoice` with `params`.
    async fn make_hold(&self, uri: &ConnectionUri, params: Value) -> Response {
        self.call(uri, "make_hold_invoice", params).await
    }

    async fn call(&self, uri: &ConnectionUri, method: &str, params: Value) -> Response {
        self.call_enc(uri, Encryption::Nip44V2, method, params)
            .await
    }

    /// The next notification to `uri` matching `pred` (kind and decrypted content).
    async fn notification(
        &self,
        uri: &ConnectionUri,
        pred: impl Fn(&Notification) -> bool,
        timeout: Duration,
    ) -> Option<(Event, Notification)> {
        let keys = keys_of(uri);
        let wallet = wallet_pk(uri);
        let me = keys.public_key();
        let open = move |e: &Event| -> Option<Notification> {
            let enc = match e.kind.as_u16() {
                KIND_NOTIFICATION => Encryption::Nip44V2,
                KIND_NOTIFICATION_NIP04 => Encryption::Nip04,
                _ => return None,
            };
            if e.pubkey != wallet || !e.tags.public_keys().any(|p| *p == me) {
                return None;
            }
            wire::open(&keys, e, enc).ok()
        };
        let ev = self
            .take(|e| open(e).is_some_and(|n| pred(&n)), timeout)
            .await?;
        let n = open(&ev)?;
        Some((ev, n))
    }
}

fn ok(resp: &Response) -> &Value {
    assert!(resp.error.is_none(), "unexpected error: {:?}", resp.error);
    resp.result.as_ref().expect("result")
}

fn code(resp: &Response) -> ErrorCode {
    resp.error
        .as_ref()
        .unwrap_or_else(|| panic!("expected an error: {resp:?}"))
        .code
        .clone()
}

fn tx(resp: &Response) -> Transaction {
    serde_json::from_value(ok(resp).clone()).unwrap()
}

fn sha256_hex(preimage_hex: &str) -> String {
    sha256::Hash::hash(&hex::decode(preimage_hex).unwrap()).to_string()
}

fn is(kind: &'static str, hash: String) -> impl Fn(&Notification) -> bool {
    move |n| n.notification_type == kind && n.notification["payment_hash"] == hash.as_str()
}

async fn devnet() -> Devnet {
    Devnet::start(DevnetConfig::default()).await.unwrap()
}

async fn two_wallets(devnet: &Devnet) -> (nwc_devnet::WalletHandle, nwc_devnet::WalletHandle, App) {
    let alice = devnet
        .create_wallet(WalletSpec::new("alice", 1_000_000))
        .await
        .unwrap();
    let bob = devnet
        .create_wallet(WalletSpec::new("bob", 0))
        .await
        .unwrap();
    let app = App::new(
        devnet.relay_url(),
        &[keys_of(&alice.uri), keys_of(&bob.uri)],
    )
    .await;
    (alice, bob, app)
}

async fn invoice(app: &App, uri: &ConnectionUri, msat: u64) -> Transaction {
    tx(&app
        .call(uri, "make_invoice", json!({ "amount": msat }))
        .await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pay_moves_balances_and_the_preimage_hashes_to_the_payment_hash() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;

    let inv = tx(&app
        .call(
            &bob.uri,
            "make_invoice",
            json!({"amount": 21_000, "description": "coffee", "expiry": 600}),
        )
        .await);
    assert_eq!(inv.kind, "incoming");
    assert_eq!(inv.state, Some(TxState::Pending));
    assert_eq!(inv.amount, 21_000);
    assert!(inv.preimage.is_none());

    // A real regtest BOLT11, signed by bob's node key.
    let bolt11 = inv.invoice.clone().unwrap();
    let parsed = Bolt11Invoice::from_str(&bolt11).unwrap();
    parsed.check_signature().unwrap();
    assert_eq!(parsed.currency(), Currency::Regtest);
    assert!(bolt11.starts_with("lnbcrt"));
    assert_eq!(parsed.recover_payee_pub_key().to_string(), bob.node_pubkey);
    assert_eq!(parsed.amount_milli_satoshis(), Some(21_000));
    assert_eq!(parsed.payment_hash().to_string(), inv.payment_hash);
    assert_eq!(parsed.description().to_string(), "coffee");
    assert_eq!(parsed.expiry_time(), Duration::from_secs(600));
    assert_eq!(parsed.min_final_cltv_expiry_delta(), 18);
    assert_ne!(parsed.payment_secret().0, [0; 32]);
    assert_eq!(inv.expires_at, Some(inv.created_at + 600));

    let info = ok(&app.call(&bob.uri, "get_info", json!({})).await).clone();
    assert_eq!(info["pubkey"], bob.node_pubkey.as_str());
    assert_eq!(info["network"], "regtest");
    assert_eq!(info["alias"], "bob");
    assert_eq!(info["methods"].as_array().unwrap().len(), METHODS.len());
    assert!(
        info["notifications"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "hold_invoice_accepted")
    );

    let paid = ok(&app.pay_invoice(&alice.uri, &bolt11).await).clone();
    let preimage = paid["preimage"].as_str().unwrap().to_owned();
    assert_eq!(sha256_hex(&preimage), inv.payment_hash);
    assert_eq!(paid["fees_paid"], 0);

    assert_eq!(devnet.balance_msat("alice").unwrap(), 979_000);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 21_000);
    assert_eq!(
        ok(&app.call(&alice.uri, "get_balance", json!({})).await)["balance"],
        979_000
    );
    assert_eq!(
        ok(&app.call(&bob.uri, "get_balance", json!({})).await)["balance"],
        21_000
    );

    let h = inv.payment_hash.clone();
    let incoming = tx(&app.lookup(&bob.uri, &h).await);
    assert_eq!(incoming.state, Some(TxState::Settled));
    assert_eq!(incoming.preimage.as_deref(), Some(preimage.as_str()));
    assert_eq!(incoming.kind, "incoming");
    assert!(incoming.settled_at.is_some());
    let outgoing = tx(&app
        .call(&alice.uri, "lookup_invoice", json!({ "invoice": bolt11 }))
        .await);
    assert_eq!(outgoing.kind, "outgoing");
    assert_eq!(outgoing.state, Some(TxState::Settled));
    assert_eq!(outgoing.preimage.as_deref(), Some(preimage.as_str()));

    let list = ok(&app.call(&alice.uri, "list_transactions", json!({})).await).clone();
    let list: Vec<Transaction> = serde_json::from_value(list["transactions"].clone()).unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].payment_hash, h);

    // Notifications (NIP-44, kind 23197) to both sides.
    let (ev, n) = app
        .notification(&bob.uri, is("payment_received", h.clone()), T)
        .await
        .expect("payment_received");
    assert_eq!(ev.kind, Kind::from(KIND_NOTIFICATION));
    assert_eq!(n.notification["preimage"], preimage.as_str());
    assert_eq!(n.notification["amount"], 21_000);
    app.notification(&alice.uri, is("payment_sent", h.clone()), T)
        .await
        .expect("payment_sent");
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_are_refused_as_nip47_errors() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;

    // Insufficient balance.
    let big = invoice(&app, &bob.uri, 5_000_000).await;
    let r = app.pay_invoice(&alice.uri, &big.invoice).await;
    assert_eq!(code(&r), ErrorCode::InsufficientBalance);
    assert_eq!(devnet.balance_msat("alice").unwrap(), 1_000_000);

    // Paying twice.
    let inv = invoice(&app, &bob.uri, 1_000).await;
    ok(&app.pay_invoice(&alice.uri, &inv.invoice).await);
    let r = app.pay_invoice(&alice.uri, &inv.invoice).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);
    assert_eq!(devnet.balance_msat("alice").unwrap(), 999_000);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 1_000);

    // Self-payment.
    let own = invoice(&app, &alice.uri, 1_000).await;
    let r = app.pay_invoice(&alice.uri, &own.invoice).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);

    // A node outside the network: no route.
    let secp = bitcoin::secp256k1::Secp256k1::new();
    let stranger = bitcoin::secp256k1::SecretKey::from_slice(&[0x42; 32]).unwrap();
    let foreign = InvoiceBuilder::new(Currency::Regtest)
        .description("elsewhere".into())
        .payment_hash(sha256::Hash::hash(&[1; 32]))
        .payment_secret(PaymentSecret([2; 32]))
        .amount_milli_satoshis(1_000)
        .current_timestamp()
        .min_final_cltv_expiry_delta(18)
        .build_signed(|m| secp.sign_ecdsa_recoverable(m, &stranger))
        .unwrap();
    let r = app.pay_invoice(&alice.uri, &foreign.to_string()).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);
    assert!(r.error.unwrap().message.contains("no route"));

    // Garbage and bad params.
    let r = app.pay_invoice(&alice.uri, &"lnbcrt1garbage").await;
    assert_eq!(code(&r), ErrorCode::Other);
    let r = app
        .call(&alice.uri, "make_invoice", json!({ "amount": "lots" }))
        .await;
    assert_eq!(code(&r), ErrorCode::Other);
    assert!(r.error.unwrap().message.contains("invalid params"));

    // Lookup of someone else's invoice.
    let r = app.lookup(&alice.uri, &big.payment_hash).await;
    assert_eq!(code(&r), ErrorCode::NotFound);

    // An expired invoice.
    let short = tx(&app
        .call(
            &bob.uri,
            "make_invoice",
            json!({"amount": 1_000, "expiry": 1}),
        )
        .await);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let r = app.pay_invoice(&alice.uri, &short.invoice).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);
    let t = tx(&app.lookup(&bob.uri, &short.payment_hash).await);
    assert_eq!(t.state, Some(TxState::Expired));
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_invoice_pays_only_when_the_payee_settles() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let preimage = hex::encode(rand::random::<[u8; 32]>());
    let hash = sha256_hex(&preimage);

    let hold = tx(&app
        .make_hold(
            &bob.uri,
            json!({"amount": 50_000, "payment_hash": hash, "expiry": 600}),
        )
        .await);
    assert_eq!(hold.payment_hash, hash);
    assert_eq!(hold.state, Some(TxState::Pending));
    let parsed = Bolt11Invoice::from_str(hold.invoice.as_deref().unwrap()).unwrap();
    assert_eq!(parsed.recover_payee_pub_key().to_string(), bob.node_pubkey);
    assert_eq!(parsed.payment_hash().to_string(), hash);

    let pay = app.send_pay(&alice.uri, &hold.invoice).await;
    let (_, n) = app
        .notification(&bob.uri, is("hold_invoice_accepted", hash.clone()), T)
        .await
        .expect("hold_invoice_accepted");
    assert_eq!(n.notification["state"], "accepted");
    assert!(n.notification["settle_deadline"].as_u64().is_some());

    // Locked, not paid: no response yet.
    assert!(
        app.response_event(&pay, Duration::from_millis(300))
            .await
            .is_none()
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 950_000);
    assert_eq!(devnet.locked_msat("alice").unwrap(), 50_000);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 0);
    assert_eq!(
        ok(&app.call(&alice.uri, "get_balance", json!({})).await)["balance"],
        950_000
    );
    let t = tx(&app.lookup(&bob.uri, &hash).await);
    assert_eq!(t.state, Some(TxState::Accepted));
    assert!(t.preimage.is_none());
    let t = tx(&app.lookup(&alice.uri, &hash).await);
    assert_eq!(t.state, Some(TxState::Pending));

    // A wrong preimage settles nothing; alice cannot settle bob's invoice.
    let wrong = app.settle_hold(&bob.uri, &hex::encode([7u8; 32])).await;
    assert_eq!(code(&wrong), ErrorCode::NotFound);
    let r = app.settle_hold(&alice.uri, &preimage).await;
    assert_eq!(code(&r), ErrorCode::NotFound);

    ok(&app.settle_hold(&bob.uri, &preimage).await);
    let resp = app
        .response(&keys_of(&alice.uri), &pay, T)
        .await
        .expect("pay response");
    assert_eq!(ok(&resp)["preimage"], preimage.as_str());

    assert_eq!(devnet.balance_msat("alice").unwrap(), 950_000);
    assert_eq!(devnet.locked_msat("alice").unwrap(), 0);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 50_000);
    app.notification(&bob.uri, is("payment_received", hash.clone()), T)
        .await
        .expect("payment_received");
    app.notification(&alice.uri, is("payment_sent", hash.clone()), T)
        .await
        .expect("payment_sent");
    let t = tx(&app.lookup(&bob.uri, &hash).await);
    assert_eq!(t.state, Some(TxState::Settled));
    assert_eq!(t.preimage.as_deref(), Some(preimage.as_str()));

    // Settled once, paid once.
    ok(&app.settle_hold(&bob.uri, &preimage).await);
    let r = app.pay_invoice(&alice.uri, &hold.invoice).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 50_000);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_invoice_cancel_and_expiry_give_the_funds_back() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;

    // Cancel after acceptance.
    let preimage = hex::encode(rand::random::<[u8; 32]>());
    let hash = sha256_hex(&preimage);
    let hold = tx(&app
        .make_hold(&bob.uri, json!({"amount": 30_000, "payment_hash": hash}))
        .await);
    let pay = app.send_pay(&alice.uri, &hold.invoice).await;
    app.notification(&bob.uri, is("hold_invoice_accepted", hash.clone()), T)
        .await
        .expect("accepted");
    assert_eq!(devnet.locked_msat("alice").unwrap(), 30_000);
    ok(&app.cancel_hold(&bob.uri, &hash).await);
    let resp = app
        .response(&keys_of(&alice.uri), &pay, T)
        .await
        .expect("pay response");
    assert_eq!(code(&resp), ErrorCode::PaymentFailed);
    assert_eq!(devnet.balance_msat("alice").unwrap(), 1_000_000);
    assert_eq!(devnet.locked_msat("alice").unwrap(), 0);
    assert_eq!(devnet.balance_msat("bob").unwrap(), 0);
    let t = tx(&app.lookup(&bob.uri, &hash).await);
    assert_eq!(t.state, Some(TxState::Failed));
    let r = app.settle_hold(&bob.uri, &preimage).await;
    assert_eq!(code(&r), ErrorCode::Other);

    // Canceled before payment: cannot be paid.
    let hash2 = sha256_hex(&hex::encode([9u8; 32]));
    let hold2 = tx(&app
        .make_hold(&bob.uri, json!({"amount": 1_000, "payment_hash": hash2}))
        .await);
    ok(&app.cancel_hold(&bob.uri, &hash2).await);
    let r = app.pay_invoice(&alice.uri, &hold2.invoice).await;
    assert_eq!(code(&r), ErrorCode::PaymentFailed);

    // Expiry while accepted: the payment fails, the funds come back.
    let preimage3 = hex::encode(rand::random::<[u8; 32]>());
    let hash3 = sha256_hex(&preimage3);
    let hold3 = tx(&app
        .make_hold(
            &bob.uri,
            json!({"amount": 7_000, "payment_hash": hash3, "expiry": 2}),
        )
        .await);
    let t0 = Instant::now();
    let pay3 = app.send_pay(&alice.uri, &hold3.invoice).await;
    app.notification(&bob.uri, is("hold_invoice_accepted", hash3.clone()), T)
        .await
        .expect("accepted");
    assert_eq!(devnet.locked_msat("alice").unwrap(), 7_000);
    let resp = app
        .response(&keys_of(&alice.uri), &pay3, T)
        .await
        .expect("pay response");
    assert_eq!(code(&resp), ErrorCode::PaymentFailed);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 1_000_000);
    assert_eq!(devnet.locked_msat("alice").unwrap(), 0);
    let t = tx(&app.lookup(&bob.uri, &hash3).await);
    assert_eq!(t.state, Some(TxState::Failed));
    let r = app.settle_hold(&bob.uri, &preimage3).await;
    assert_eq!(code(&r), ErrorCode::Other);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nip04_only_wallet_speaks_nip04_and_refuses_nip44() {
    let devnet = devnet().await;
    let carol = devnet
        .create_wallet(WalletSpec {
            nip04_only: true,
            ..WalletSpec::new("carol", 100_000)
        })
        .await
        .unwrap();
    let dave = devnet
        .create_wallet(WalletSpec::new("dave", 0))
        .await
        .unwrap();
    let app = App::new(
        devnet.relay_url(),
        &[keys_of(&carol.uri), keys_of(&dave.uri)],
    )
    .await;

    // Info events (stored by the relay).
    let infos = app
        .client
        .fetch_events(
            Filter::new()
                .kind(Kind::from(KIND_INFO))
                .authors([wallet_pk(&carol.uri), wallet_pk(&dave.uri)]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(infos.len(), 2);
    for info in infos.iter() {
        let enc = info
            .tags
            .find(TagKind::custom("encryption"))
            .and_then(|t| t.content())
            .unwrap();
        if info.pubkey == wallet_pk(&carol.uri) {
            assert_eq!(enc, "nip04");
        } else {
            assert_eq!(enc, "nip44_v2 nip04");
        }
        assert!(info.content.split(' ').any(|m| m == "make_hold_invoice"));
        let notes = info
            .tags
            .find(TagKind::custom("notifications"))
            .and_then(|t| t.content());
        assert!(notes.unwrap().contains("payment_received"));
    }

    let r = app
        .call_enc(&carol.uri, Encryption::Nip04, "get_balance", json!({}))
        .await;
    assert_eq!(ok(&r)["balance"], 100_000);

    // Legacy request: no encryption tag at all.
    let ck = keys_of(&carol.uri);
    let body = serde_json::to_string(&json!({"method": "get_balance", "params": {}})).unwrap();
    let legacy = EventBuilder::new(
        Kind::from(KIND_REQUEST),
        wire::seal(&ck, &wallet_pk(&carol.uri), Encryption::Nip04, &body).unwrap(),
    )
    .tag(Tag::public_key(wallet_pk(&carol.uri)))
    .sign_with_keys(&ck)
    .unwrap();
    app.publish(&legacy).await;
    let r = app
        .response(&ck, &legacy, T)
        .await
        .expect("legacy response");
    assert_eq!(ok(&r)["balance"], 100_000);

    // NIP-44 to a NIP-04-only wallet: UNSUPPORTED_ENCRYPTION, answered in NIP-04.
    let req = app
        .send(&carol.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    let ev = app.response_event(&req, T).await.expect("response");
    assert_eq!(wire::encryption_tag(&ev), Some(Some(Encryption::Nip04)));
    let r: Response = wire::open(&ck, &ev, Encryption::Nip04).unwrap();
    assert_eq!(code(&r), ErrorCode::UnsupportedEncryption);

    // Payments work; carol's notification is kind 23196 (NIP-04), dave's 23197.
    let inv = invoice(&app, &dave.uri, 2_500).await;
    let r = app
        .call_enc(
            &carol.uri,
            Encryption::Nip04,
            "pay_invoice",
            json!({ "invoice": inv.invoice }),
        )
        .await;
    assert_eq!(
        sha256_hex(ok(&r)["preimage"].as_str().unwrap()),
        inv.payment_hash
    );
    let (ev, _) = app
        .notification(&carol.uri, is("payment_sent", inv.payment_hash.clone()), T)
        .await
        .expect("payment_sent");
    assert_eq!(ev.kind, Kind::from(KIND_NOTIFICATION_NIP04));
    let (ev, _) = app
        .notification(
            &dave.uri,
            is("payment_received", inv.payment_hash.clone()),
            T,
        )
        .await
        .expect("payment_received");
    assert_eq!(ev.kind, Kind::from(KIND_NOTIFICATION));

    // The dual wallet also takes NIP-04 requests and answers in NIP-04.
    let r = app
        .call_enc(&dave.uri, Encryption::Nip04, "get_balance", json!({}))
        .await;
    assert_eq!(ok(&r)["balance"], 2_500);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_unknown_method_encryption_author_restrictions() {
    let devnet = devnet().await;
    let alice = devnet
        .create_wallet(WalletSpec::new("alice", 100_000))
        .await
        .unwrap();
    let bob = devnet
        .create_wallet(WalletSpec::new("bob", 0))
        .await
        .unwrap();
    let limited = devnet
        .connect(ConnectionSpec {
            wallet: "alice".into(),
            allowed_methods: Some(vec!["get_balance".into(), "get_info".into()]),
            ..ConnectionSpec::default()
        })
        .await
        .unwrap();
    let budgeted = devnet
        .connect(ConnectionSpec {
            wallet: "alice".into(),
            budget_msat: Some(10_000),
            ..ConnectionSpec::default()
        })
        .await
        .unwrap();
    let stranger = Keys::generate();
    let app = App::new(
        devnet.relay_url(),
        &[
            keys_of(&alice.uri),
            keys_of(&bob.uri),
            keys_of(&limited),
            keys_of(&budgeted),
            stranger.clone(),
        ],
    )
    .await;

    let r = app
        .call(&alice.uri, "sign_message", json!({"message": "hi"}))
        .await;
    assert_eq!(code(&r), ErrorCode::NotImplemented);

    // Unknown encryption scheme.
    let ak = keys_of(&alice.uri);
    let body = r#"{"method":"get_balance","params":{}}"#;
    let odd = EventBuilder::new(
        Kind::from(KIND_REQUEST),
        wire::seal(&ak, &wallet_pk(&alice.uri), Encryption::Nip44V2, body).unwrap(),
    )
    .tag(Tag::public_key(wallet_pk(&alice.uri)))
    .tag(Tag::custom(TagKind::custom("encryption"), ["nip99"]))
    .sign_with_keys(&ak)
    .unwrap();
    app.publish(&odd).await;
    let r = app.response(&ak, &odd, T).await.expect("response");
    assert_eq!(code(&r), ErrorCode::UnsupportedEncryption);

    // A key that is not the connection's: UNAUTHORIZED.
    let req = wire::request_event(
        &stranger,
        &wallet_pk(&alice.uri),
        Encryption::Nip44V2,
        &Request {
            method: "get_balance".into(),
            params: json!({}),
        },
        Duration::from_secs(60),
    )
    .unwrap();
    app.publish(&req).await;
    let r = app.response(&stranger, &req, T).await.expect("response");
    assert_eq!(code(&r), ErrorCode::Unauthorized);

    // Restricted connection.
    let r = app.call(&limited, "get_balance", json!({})).await;
    assert_eq!(ok(&r)["balance"], 100_000);
    let info = app.call(&limited, "get_info", json!({})).await;
    assert_eq!(ok(&info)["methods"], json!(["get_balance", "get_info"]));
    let r = app
        .call(&limited, "make_invoice", json!({"amount": 1}))
        .await;
    assert_eq!(code(&r), ErrorCode::Restricted);

    // Budget.
    let i1 = invoice(&app, &bob.uri, 8_000).await;
    let i2 = invoice(&app, &bob.uri, 8_000).await;
    ok(&app.pay_invoice(&budgeted, &i1.invoice).await);
    let r = app.pay_invoice(&budgeted, &i2.invoice).await;
    assert_eq!(code(&r), ErrorCode::QuotaExceeded);
    // Same wallet, other connection: no budget.
    ok(&app.pay_invoice(&alice.uri, &i2.invoice).await);
    assert_eq!(devnet.balance_msat("alice").unwrap(), 84_000);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_repeated_requests_are_ignored() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let ak = keys_of(&alice.uri);
    let body = r#"{"method":"get_balance","params":{}}"#;
    let expired = EventBuilder::new(
        Kind::from(KIND_REQUEST),
        wire::seal(&ak, &wallet_pk(&alice.uri), Encryption::Nip44V2, body).unwrap(),
    )
    .tag(Tag::public_key(wallet_pk(&alice.uri)))
    .tag(Tag::custom(TagKind::custom("encryption"), ["nip44_v2"]))
    .tag(Tag::expiration(Timestamp::now() - Duration::from_secs(5)))
    .sign_with_keys(&ak)
    .unwrap();
    app.publish(&expired).await;
    assert!(
        app.response_event(&expired, Duration::from_millis(500))
            .await
            .is_none()
    );
    // The service is alive: a fresh request is answered.
    ok(&app.call(&alice.uri, "get_balance", json!({})).await);

    // The same pay request delivered twice pays once and is answered once.
    let inv = invoice(&app, &bob.uri, 4_000).await;
    let req = app.send_pay(&alice.uri, &inv.invoice).await;
    app.publish(&req).await;
    let r = app.response(&ak, &req, T).await.expect("response");
    ok(&r);
    assert!(
        app.response_event(&req, Duration::from_millis(300))
            .await
            .is_none()
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 996_000);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_restart_then_requests_are_still_answered() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let url = devnet.relay_url().to_owned();
    ok(&app.call(&alice.uri, "get_balance", json!({})).await);

    let t0 = Instant::now();
    devnet.restart_relay().await.unwrap();
    assert_eq!(devnet.relay_url(), url);
    app.ready().await;
    eprintln!(
        "relay restart + both sides resubscribed in {:?}",
        t0.elapsed()
    );
    let inv = invoice(&app, &bob.uri, 3_000).await;
    let r = app.pay_invoice(&alice.uri, &inv.invoice).await;
    assert_eq!(
        sha256_hex(ok(&r)["preimage"].as_str().unwrap()),
        inv.payment_hash
    );

    // A hold payment in flight across a restart: the payer's answer still arrives.
    let preimage = hex::encode(rand::random::<[u8; 32]>());
    let hash = sha256_hex(&preimage);
    let hold = tx(&app
        .make_hold(&bob.uri, json!({"amount": 2_000, "payment_hash": hash}))
        .await);
    let pay = app.send_pay(&alice.uri, &hold.invoice).await;
    app.notification(&bob.uri, is("hold_invoice_accepted", hash.clone()), T)
        .await
        .expect("accepted");
    devnet.restart_relay().await.unwrap();
    app.ready().await;
    ok(&app.settle_hold(&bob.uri, &preimage).await);
    let r = app
        .response(&keys_of(&alice.uri), &pay, T)
        .await
        .expect("pay response");
    assert_eq!(ok(&r)["preimage"], preimage.as_str());
    assert_eq!(devnet.balance_msat("bob").unwrap(), 5_000);

    // Down for a while, then back: the info events survived.
    devnet.stop_relay().await;
    assert!(!devnet.relay().is_running().await);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    devnet.resume_relay().await.unwrap();
    app.ready().await;
    assert_eq!(
        ok(&app.call(&bob.uri, "get_balance", json!({})).await)["balance"],
        5_000
    );
    let infos = app
        .client
        .fetch_events(
            Filter::new()
                .kind(Kind::from(KIND_INFO))
                .author(wallet_pk(&alice.uri)),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(infos.len(), 1);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_local_relay_mode_works_too() {
    let devnet = Devnet::start(DevnetConfig {
        nodelay: false,
        ..DevnetConfig::default()
    })
    .await
    .unwrap();
    let (alice, bob, app) = two_wallets(&devnet).await;
    let inv = invoice(&app, &bob.uri, 1_000).await;
    let t = Instant::now();
    ok(&app.pay_invoice(&alice.uri, &inv.invoice).await);
    eprintln!("plain LocalRelay: one payment in {:?}", t.elapsed());
    devnet.restart_relay().await.unwrap();
    app.ready().await;
    assert_eq!(
        ok(&app.call(&bob.uri, "get_balance", json!({})).await)["balance"],
        1_000
    );
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_make_the_wallet_misbehave() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let ak = keys_of(&alice.uri);

    // A lying payer wallet: a preimage that does not match, and no money moved.
    fault(&devnet, "alice", |f| f.lie_about_settlement = true);
    let inv = invoice(&app, &bob.uri, 1_000).await;
    let r = app.pay_invoice(&alice.uri, &inv.invoice).await;
    assert_ne!(
        sha256_hex(ok(&r)["preimage"].as_str().unwrap()),
        inv.payment_hash
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 1_000_000);
    // A lying payee wallet: "settled" with a made-up preimage.
    devnet.set_faults("alice", Faults::default()).unwrap();
    fault(&devnet, "bob", |f| f.lie_about_settlement = true);
    let t = tx(&app.lookup(&bob.uri, &inv.payment_hash).await);
    assert_eq!(t.state, Some(TxState::Settled));
    assert_ne!(sha256_hex(t.preimage.as_deref().unwrap()), inv.payment_hash);
    devnet.set_faults("bob", Faults::default()).unwrap();

    // Wrong result type.
    fault(&devnet, "alice", |f| f.wrong_result_type = true);
    let req = app
        .send(&alice.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    let r = app.response(&ak, &req, T).await.unwrap();
    assert_eq!(r.result_type, "get_info");

    // Malformed content.
    fault(&devnet, "alice", |f| f.malformed_content = true);
    let req = app
        .send(&alice.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    let ev = app.response_event(&req, T).await.unwrap();
    assert!(wire::open::<Response>(&ak, &ev, Encryption::Nip44V2).is_err());

    // Missing e tag: the response cannot be matched to its request.
    fault(&devnet, "alice", |f| f.missing_e_tag = true);
    let req = app
        .send(&alice.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    let wallet = wallet_pk(&alice.uri);
    let ev = app
        .take(
            move |e| e.kind == Kind::from(KIND_RESPONSE) && e.pubkey == wallet,
            T,
        )
        .await
        .unwrap();
    assert_eq!(ev.tags.event_ids().count(), 0);
    assert!(
        app.response_event(&req, Duration::from_millis(100))
            .await
            .is_none()
    );

    // Missing p tag: the relay never routes it to the app.
    fault(&devnet, "alice", |f| f.missing_p_tag = true);
    let req = app
        .send(&alice.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    assert!(
        app.response_event(&req, Duration::from_millis(500))
            .await
            .is_none()
    );

    // Silent: nothing executed, nothing answered.
    fault(&devnet, "alice", |f| f.silent = true);
    let inv = invoice(&app, &bob.uri, 1_000).await;
    let req = app.send_pay(&alice.uri, &inv.invoice).await;
    assert!(
        app.response_event(&req, Duration::from_millis(500))
            .await
            .is_none()
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 1_000_000);

    // Dropped response: executed, never answered; lookup tells the truth.
    fault(&devnet, "alice", |f| f.drop_responses = true);
    let req = app.send_pay(&alice.uri, &inv.invoice).await;
    assert!(
        app.response_event(&req, Duration::from_millis(500))
            .await
            .is_none()
    );
    assert_eq!(devnet.balance_msat("alice").unwrap(), 999_000);
    devnet.set_faults("alice", Faults::default()).unwrap();
    let t = tx(&app.lookup(&alice.uri, &inv.payment_hash).await);
    assert_eq!(t.state, Some(TxState::Settled));
    assert_eq!(sha256_hex(t.preimage.as_deref().unwrap()), inv.payment_hash);

    // Injected error code.
    devnet
        .set_faults(
            "alice",
            Faults {
                fail_with: Some(ErrorCode::RateLimited),
                ..Faults::default()
            },
        )
        .unwrap();
    let r = app.call(&alice.uri, "get_balance", json!({})).await;
    assert_eq!(code(&r), ErrorCode::RateLimited);

    // Delay.
    devnet
        .set_faults(
            "alice",
            Faults {
                delay: Some(Duration::from_millis(400)),
                ..Faults::default()
            },
        )
        .unwrap();
    let t0 = Instant::now();
    ok(&app.call(&alice.uri, "get_balance", json!({})).await);
    assert!(t0.elapsed() >= Duration::from_millis(400));

    // Out of order: the first response comes after the second.
    fault(&devnet, "alice", |f| f.out_of_order = true);
    let a = app
        .send(&alice.uri, Encryption::Nip44V2, "get_balance", json!({}))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = app
        .send(&alice.uri, Encryption::Nip44V2, "get_info", json!({}))
        .await;
    let (ia, ib) = (a.id, b.id);
    let first_seen = app
        .take(
            move |e| {
                e.kind == Kind::from(KIND_RESPONSE)
                    && e.tags.event_ids().any(|x| *x == ia || *x == ib)
            },
            T,
        )
        .await
        .unwrap();
    assert!(
        first_seen.tags.event_ids().any(|x| *x == ib),
        "the second request is answered first"
    );
    app.response_event(&a, T).await.unwrap();

    // Duplicate notifications: two distinct events for one payment.
    fault(&devnet, "bob", |f| f.duplicate_notifications = true);
    devnet.set_faults("alice", Faults::default()).unwrap();
    let inv = invoice(&app, &bob.uri, 1_000).await;
    ok(&app.pay_invoice(&alice.uri, &inv.invoice).await);
    let (e1, _) = app
        .notification(
            &bob.uri,
            is("payment_received", inv.payment_hash.clone()),
            T,
        )
        .await
        .unwrap();
    let (e2, _) = app
        .notification(
            &bob.uri,
            is("payment_received", inv.payment_hash.clone()),
            T,
        )
        .await
        .unwrap();
    assert_ne!(e1.id, e2.id);
    devnet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devnet_api_refusals() {
    let devnet = devnet().await;
    devnet
        .create_wallet(WalletSpec::new("alice", 1))
        .await
        .unwrap();
    assert!(
        devnet
            .create_wallet(WalletSpec::new("alice", 1))
            .await
            .is_err()
    );
    assert!(devnet.balance_msat("nobody").is_err());
    assert!(devnet.set_faults("nobody", Faults::default()).is_err());
    assert!(
        devnet
            .connect(ConnectionSpec {
                wallet: "nobody".into(),
                ..ConnectionSpec::default()
            })
            .await
            .is_err()
    );
    devnet.shutdown().await;
}

/// Sequential throughput and one payment's latency (printed; run alone for clean numbers:
/// `cargo test -p rail-ln-nwc --test devnet throughput -- --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_and_latency() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let n = 100u32;
    let mut pay_lat = Vec::new();
    let t0 = Instant::now();
    for _ in 0..n {
        let inv = invoice(&app, &bob.uri, 1_000).await;
        let t = Instant::now();
        let r = app.pay_invoice(&alice.uri, &inv.invoice).await;
        pay_lat.push(t.elapsed());
        ok(&r);
    }
    let total = t0.elapsed();
    assert_eq!(devnet.balance_msat("bob").unwrap(), u64::from(n) * 1_000);
    pay_lat.sort();
    let mut rtt = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        ok(&app.call(&alice.uri, "get_balance", json!({})).await);
        rtt.push(t.elapsed());
    }
    rtt.sort();
    eprintln!(
        "devnet: {n} sequential payments (make_invoice + pay_invoice over NIP-44) in {total:?} = {:.1} payments/s; \
         pay_invoice latency median {:?} p95 {:?} min {:?}; get_balance RTT median {:?}",
        f64::from(n) / total.as_secs_f64(),
        pay_lat[pay_lat.len() / 2],
        pay_lat[pay_lat.len() * 95 / 100],
        pay_lat[0],
        rtt[rtt.len() / 2],
    );
    devnet.shutdown().await;
}

/// A connection that speaks NIP-44 and NIP-04 gets every notification on both kinds, as wallet
/// services in the field publish them: a NIP-04 listener on kind 23196 (the ContextVM SDK
/// 0.11.14's `NwcClient`, which decrypts both kinds with NIP-04 —
/// `docs/research/contextvm-sdk-0.11.14.md` §3.6) and a NIP-44 listener on kind 23197 each
/// receive the same `payment_received`; this crate's `NwcClient` still delivers it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nip44_connection_gets_both_notification_kinds() {
    let devnet = devnet().await;
    let (alice, bob, app) = two_wallets(&devnet).await;
    let client = rail_ln_nwc::client::NwcClient::connect(
        &bob.uri,
        rail_ln_nwc::client::ClientOptions::default(),
    )
    .await
    .unwrap();
    let mut delivered = client.notifications();

    let inv = invoice(&app, &bob.uri, 5_000).await;
    let bolt11 = inv.invoice.clone().unwrap();
    ok(&app.pay_invoice(&alice.uri, &bolt11).await);

    let h = inv.payment_hash.clone();
    let of_kind = |kind: u16, hash: String| {
        let keys = keys_of(&bob.uri);
        let wallet = wallet_pk(&bob.uri);
        move |e: &Event| {
            let enc = if kind == KIND_NOTIFICATION {
                Encryption::Nip44V2
            } else {
                Encryption::Nip04
            };
            e.kind.as_u16() == kind
                && e.pubkey == wallet
                && wire::open::<Notification>(&keys, e, enc).is_ok_and(|n| {
                    n.notification_type == "payment_received"
                        && n.notification["payment_hash"] == hash.as_str()
                })
        }
    };
    let nip44 = app
        .take(of_kind(KIND_NOTIFICATION, h.clone()), T)
        .await
        .expect("a NIP-44 listener gets payment_received on kind 23197");
    let nip04 = app
        .take(of_kind(KIND_NOTIFICATION_NIP04, h.clone()), T)
        .await
        .expect("a NIP-04 listener gets payment_received on kind 23196");
    let (a, b): (Notification, Notification) = (
        wire::open(&keys_of(&bob.uri), &nip44, Encryption::Nip44V2).unwrap(),
        wire::open(&keys_of(&bob.uri), &nip04, Encryption::Nip04).unwrap(),
    );
    assert_eq!(a, b, "the same notification on both kinds");

    // The crate's client, subscribed to both kinds, delivers it once.
    let first = tokio::time::timeout(T, async {
        loop {
            let n = delivered.recv().await.unwrap();
            if n.notification_type == "payment_received" {
                return n;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(first.notification["payment_hash"], h.as_str());
    let again = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            let n = delivered.recv().await.unwrap();
            if n.notification_type == "payment_received" {
                return n;
            }
        }
    })
    .await;
    assert!(again.is_err(), "delivered twice: {again:?}");
    client.shutdown().await;
    devnet.shutdown().await;
}
