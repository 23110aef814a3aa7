//! What the network can do to a ContextVM server and its payments, with raw events on
//! nwc-devnet's relay: a replayed or re-wrapped request runs once, an old request is not run, a
//! plain message to a server that requires encryption is dropped, and a payment admits one
//! request only.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Tools, world};
use nostr::{Event, EventBuilder, Keys, Kind, Tag, Timestamp};
use nostr_sdk::Filter;
use serde_json::{Value, json};
use stipendex_contextvm::transport::Encryption;
use stipendex_contextvm::transport::relay::{RelaySettings, Relays};
use stipendex_contextvm::transport::server::{Server, ServerOptions};
use stipendex_contextvm::transport::wire::{self, Wrap};
use tokio::sync::mpsc;

/// A raw peer: its relays and the inbox of what is addressed to it.
async fn raw(url: &str, keys: &Keys) -> (Relays, mpsc::Receiver<Event>) {
    let filter = Filter::new()
        .kinds([
            Kind::from(wire::MESSAGE),
            Kind::from(wire::GIFT_WRAP),
            Kind::from(wire::EPHEMERAL_GIFT_WRAP),
        ])
        .pubkey(keys.public_key())
        .since(Timestamp::now() - 60);
    Relays::connect(keys, &[url.to_owned()], filter, RelaySettings::default())
        .await
        .unwrap()
}

fn echo(q: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "echo", "arguments": {"q": q}}})
}

/// The next message in `inbox` (opened), or `None` within `wait`.
async fn next(keys: &Keys, inbox: &mut mpsc::Receiver<Event>, wait: Duration) -> Option<Event> {
    let ev = tokio::time::timeout(wait, inbox.recv()).await.ok()??;
    Some(wire::open(keys, &ev).unwrap().0)
}

/// The same request event again — its answer lost, or a replay by anyone who saw it — never
/// runs twice: the server sends the same answer again (the same signed answer, sealed afresh, to
/// the request's signer only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_or_rewrapped_request_runs_once_and_gets_its_answer_again() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), None).await;
    let k = Keys::generate();
    let (relays, mut inbox) = raw(&w.url(), &k).await;

    // A stateless request (no initialize): the server initialises the session itself.
    let inner = wire::message(&k, &server.public_key(), &echo("once"), Vec::new()).unwrap();
    let wrapped = wire::wrap(&inner, &server.public_key(), Wrap::Ephemeral).unwrap();
    relays.publish(&wrapped).await.unwrap();
    let answer = next(&k, &mut inbox, Duration::from_secs(10))
        .await
        .expect("an answer");
    assert_eq!(wire::answers(&answer), Some(inner.id));
    let body = wire::json_rpc(&answer).unwrap();
    assert_eq!(body["id"], 1, "the client's own id comes back");
    assert_eq!(body["result"]["content"][0]["text"], "echo: once");

    // The same inner event in a fresh wrap, then in plain: the same answer each time.
    let rewrapped = wire::wrap(&inner, &server.public_key(), Wrap::Persistent).unwrap();
    relays.publish(&rewrapped).await.unwrap();
    let again = next(&k, &mut inbox, Duration::from_secs(10))
        .await
        .expect("the answer again");
    assert_eq!(again.id, answer.id, "the same signed answer");
    relays.publish(&inner).await.unwrap();
    let again = next(&k, &mut inbox, Duration::from_secs(10))
        .await
        .expect("the answer again");
    assert_eq!(again.id, answer.id);
    // The very same wrap again is the same event to the relays and to the server: dropped.
    relays.publish(&wrapped).await.unwrap();
    assert!(
        next(&k, &mut inbox, Duration::from_millis(500))
            .await
            .is_none()
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1, "it ran once");
    relays.shutdown().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_request_and_a_plain_one_to_an_encrypted_server_are_dropped() {
    let w = world().await;
    let tools = Tools::default();
    let mut opts = ServerOptions::new(vec![w.url()]);
    opts.encryption = Encryption::Required;
    let t = tools.clone();
    let server = Server::start(Keys::generate(), opts, move || t.clone(), None)
        .await
        .unwrap();
    let k = Keys::generate();
    let (relays, mut inbox) = raw(&w.url(), &k).await;

    // Signed twenty minutes ago (a replay of an old request): dropped.
    let old = EventBuilder::new(Kind::from(wire::MESSAGE), echo("old").to_string())
        .tag(Tag::public_key(server.public_key()))
        .custom_created_at(Timestamp::now() - 1200)
        .sign_with_keys(&k)
        .unwrap();
    relays
        .publish(&wire::wrap(&old, &server.public_key(), Wrap::Ephemeral).unwrap())
        .await
        .unwrap();
    // Plain, to a server that requires encryption: dropped.
    let plain = wire::message(&k, &server.public_key(), &echo("plain"), Vec::new()).unwrap();
    relays.publish(&plain).await.unwrap();
    assert!(next(&k, &mut inbox, Duration::from_secs(1)).await.is_none());
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0);

    // Wrapped and fresh: answered, wrapped (the server requires it).
    let fresh = wire::message(&k, &server.public_key(), &echo("fresh"), Vec::new()).unwrap();
    relays
        .publish(&wire::wrap(&fresh, &server.public_key(), Wrap::Persistent).unwrap())
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ev.kind.as_u16(),
        wire::GIFT_WRAP,
        "answered in the client's wrap"
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    relays.shutdown().await;
    server.shutdown().await;
}

/// A paid request whose answer was lost: sent again, it gets the same answer for the same
/// payment — no second payment request, no second charge, no second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_paid_answer_is_sent_again_for_the_same_payment() {
    use stipendex_contextvm::payments::notify::Notification;
    use stipendex_contextvm::transport::client::PaidRequest;

    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let k = Keys::generate();
    let (relays, mut inbox) = raw(&w.url(), &k).await;
    let search = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                        "params": {"name": "search", "arguments": {"q": "once"}}});
    let inner = wire::message(
        &k,
        &server.public_key(),
        &search,
        vec![wire::pmi_tag("bitcoin-lightning-bolt11")],
    )
    .unwrap();
    relays
        .publish(&wire::wrap(&inner, &server.public_key(), Wrap::Ephemeral).unwrap())
        .await
        .unwrap();
    let required = next(&k, &mut inbox, Duration::from_secs(10)).await.unwrap();
    let Ok(Some(Notification::Required(required))) =
        Notification::from_json_rpc(&wire::json_rpc(&required).unwrap())
    else {
        panic!("not a payment_required");
    };
    let agent = w.agent("agent").await;
    let req = PaidRequest {
        server: server.public_key(),
        event_id: inner.id,
        message: search.clone(),
    };
    agent.pay(&req, &required).await.unwrap();
    // payment_accepted, then the answer.
    let mut answer = None;
    for _ in 0..2 {
        let ev = next(&k, &mut inbox, Duration::from_secs(10)).await.unwrap();
        if wire::json_rpc(&ev).unwrap().get("result").is_some() {
            answer = Some(ev);
        }
    }
    let answer = answer.expect("the paid answer");
    // "Lost": the client sends the same request again.
    relays
        .publish(&wire::wrap(&inner, &server.public_key(), Wrap::Ephemeral).unwrap())
        .await
        .unwrap();
    let again = next(&k, &mut inbox, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        again.id, answer.id,
        "the same answer, not a payment request"
    );
    assert!(
        next(&k, &mut inbox, Duration::from_millis(500))
            .await
            .is_none()
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    relays.shutdown().await;
    server.shutdown().await;
}

/// A payment admits one request: the processor refuses to accept the same settled invoice a
/// second time (the rail's single-use mark), so a client cannot pay once and be served twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_accepted_once() {
    use stipendex_contextvm::payments::NwcProcessor;
    use stipendex_contextvm::payments::server::{Deadline, Processor as _};
    use stipendex_contextvm::transport::client::PaidRequest;
    use stipendex_contextvm::transport::server::Held;

    let w = world().await;
    let processor = NwcProcessor::new(w.shop_receiver.clone(), w.shop.clone());
    let client = Keys::generate();
    let held = Held {
        client: client.public_key(),
        pmis: vec!["bitcoin-lightning-bolt11".into()],
        event_id: nostr::EventId::all_zeros(),
        interaction: None,
        message: json!({}),
        hold: 0,
    };
    let pending = processor
        .require(&common::sats(10), Some("x"), Duration::from_secs(60), &held)
        .await
        .unwrap();
    let agent = w.agent("agent").await;
    let req = PaidRequest {
        server: Keys::generate().public_key(),
        event_id: nostr::EventId::all_zeros(),
        message: json!({}),
    };
    agent.pay(&req, &pending.required).await.unwrap();
    let deadline = Deadline::at(tokio::time::Instant::now() + Duration::from_secs(10));
    let meta = processor
        .verify(&pending, &deadline)
        .await
        .unwrap()
        .unwrap();
    assert!(meta.contains_key("payment_hash"));
    let again = processor.verify(&pending, &deadline).await;
    assert!(again.is_err(), "the same payment was accepted twice");
    let _ = Arc::clone(&w.shop);
}

/// What a third party can make the wallet pay: nothing. A request in the clear shows its event
/// id to everyone on the relay; a `payment_required` about it signed by anyone but the server
/// never reaches the client's handler — the same notification from the server does (control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_request_forged_by_a_third_party_is_never_paid() {
    use rmcp::service::{RoleClient, TxJsonRpcMessage};
    use rmcp::transport::Transport as _;
    use stipendex_contextvm::payments::notify::{Notification, PaymentRequired};
    use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport};

    let w = world().await;
    let server = Keys::generate(); // a server that never answers: the request stays pending
    let mallory = Keys::generate();
    let mut watch = common::Watch::new(w.agent("agent").await);
    watch.pay = false;
    let watch = std::sync::Arc::new(watch);
    let mut opts = ClientOptions::new(vec![w.url()], server.public_key());
    opts.encryption = Encryption::Disabled;
    opts.resend_after = None;
    let client_keys = Keys::generate();
    let mut t = ClientTransport::connect(client_keys.clone(), opts, Some(watch.clone()))
        .await
        .unwrap();

    // Mallory (and the server) watch the relay for what is addressed to the server.
    let (m_relays, mut m_inbox) = raw(&w.url(), &server).await;
    let request: TxJsonRpcMessage<RoleClient> = serde_json::from_value(json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "search", "arguments": {"q": "x"}}
    }))
    .unwrap();
    t.send(request).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), m_inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.kind.as_u16(), wire::MESSAGE, "sent in the clear");
    let required = Notification::Required(PaymentRequired {
        amount: 10,
        pay_req: "lnbcrt100n1forged".into(),
        pmi: "bitcoin-lightning-bolt11".into(),
        description: None,
        ttl: Some(60),
        meta: None,
    })
    .to_json_rpc()
    .unwrap();
    let forged = wire::message(
        &mallory,
        &client_keys.public_key(),
        &required,
        vec![Tag::event(seen.id)],
    )
    .unwrap();
    m_relays.publish(&forged).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        watch.seen.load(Ordering::SeqCst),
        0,
        "a forged request reached the handler"
    );

    // The control: the same notification signed by the server reaches it.
    let genuine = wire::message(
        &server,
        &client_keys.public_key(),
        &required,
        vec![Tag::event(seen.id)],
    )
    .unwrap();
    m_relays.publish(&genuine).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while watch.seen.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server's own payment request reaches the handler");
    m_relays.shutdown().await;
}
