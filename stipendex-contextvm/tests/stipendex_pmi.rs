//! The `stipendex` payment method over ContextVM: a Quote as `pay_req`, the wallet's Proof back
//! in `notifications/stipendex/proof`, the Receipt on the answer — here over the embedded
//! ledger rail, so any rail of the registry can pay a ContextVM tool. A Quote relayed from
//! another call or another server is not paid; a Proof admits one request.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Tools, call, text};
use nostr::Keys;
use rmcp::ServiceExt;
use serde_json::json;
use stipendex::envelope::SecretKey;
use stipendex::ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex::wallet::{MemoryJournal, Wallet};
use stipendex::{Asset, Money, Registry};
use stipendex_contextvm::payments::notify::PaymentRequired;
use stipendex_contextvm::payments::server::Deadline;
use stipendex_contextvm::payments::{ServerPayments, StipendexHandler, StipendexProcessor};
use stipendex_contextvm::transport::client::{
    ClientOptions, ClientTransport, PaidRequest, PaymentHook,
};
use stipendex_contextvm::transport::server::{Server, ServerOptions};
use stipendex_test_kit as kit;

struct Shop {
    _dir: tempfile::TempDir,
    registry: Registry,
    ledger: Ledger,
    agent: AccountId,
    shop: AccountId,
    receiver_key: SecretKey,
}

async fn shop() -> Shop {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::sqlite(&url).await.unwrap();
    let (bank, agent, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await
            .unwrap();
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: 100_000,
            user_data: 0,
        })
        .await
        .unwrap();
    let config = format!(
        r#"
        [store]
        url = "memory"
        [rails.house]
        kind = "ledger"
        url = "{url}"
        asset = "USD"
        payer_account = "{agent}"
        payee_account = "{shop}"
        "#
    );
    let registry = Registry::from_toml(&config, &BTreeMap::<String, String>::new())
        .await
        .unwrap();
    Shop {
        _dir: dir,
        registry,
        ledger,
        agent,
        shop,
        receiver_key: SecretKey::generate(),
    }
}

impl Shop {
    fn receiver(&self) -> Receiver {
        self.receiver_builder().build().unwrap()
    }

    /// The shop's receiver, `search` priced at 0.05 USD, to build on.
    fn receiver_builder(&self) -> stipendex::receiver::Builder {
        Receiver::builder("shop", self.receiver_key.clone())
            .registry(&self.registry)
            .price(PricedCapability::fixed(
                "tools/call",
                "search",
                Money::parse(Asset::usd(), "0.05").unwrap(),
            ))
    }

    /// `receiver` serving the test tools over the relay of `w` with the `stipendex` payment
    /// method, and an MCP client paying it with this shop's wallet: the server, the client,
    /// the tools' counters and the wallet's journal.
    async fn serve_and_connect(
        &self,
        w: &common::World,
        receiver: Receiver,
    ) -> (
        Server,
        rmcp::service::RunningService<rmcp::RoleClient, ()>,
        Tools,
        Arc<MemoryJournal>,
    ) {
        let server_keys = Keys::generate();
        let payments = ServerPayments::new(
            receiver.clone(),
            vec![Arc::new(StipendexProcessor::new(
                receiver,
                server_keys.public_key(),
            ))],
        )
        .unwrap();
        let tools = Tools::default();
        let t = tools.clone();
        let server = Server::start(
            server_keys.clone(),
            ServerOptions::new(vec![w.url()]),
            move || t.clone(),
            Some(Arc::new(payments)),
        )
        .await
        .unwrap();
        let origin = format!("nostr:{}", server_keys.public_key().to_hex());
        let (wallet, journal) = self.wallet(vec![origin]);
        let transport = ClientTransport::connect(
            Keys::generate(),
            ClientOptions::new(vec![w.url()], server.public_key()),
            Some(Arc::new(StipendexHandler::new(wallet))),
        )
        .await
        .unwrap();
        let client = ().serve(transport).await.unwrap();
        (server, client, tools, journal)
    }

    /// A wallet whose mandate allows receiver `shop` (its key pinned) at `origins`.
    fn wallet(&self, origins: Vec<String>) -> (Wallet, Arc<MemoryJournal>) {
        let principal = SecretKey::generate();
        let key = SecretKey::generate();
        let mandate = kit::mandate(&principal, key.public())
            .id_of_principal("principal")
            .limits(kit::limits(Asset::usd(), "1.00", "10.00"))
            .allow(kit::receiver("shop", self.receiver_key.public(), origins))
            .sign();
        kit::journaled(Wallet::builder(key, mandate).registry(&self.registry))
    }

    async fn balance(&self, id: AccountId) -> i128 {
        let a = self.ledger.account(id).await.unwrap().unwrap();
        i128::from(a.credits_posted) - i128::from(a.debits_posted)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contextvm_tool_is_paid_over_the_ledger_with_a_quote_a_proof_and_a_receipt() {
    let w = common::world().await; // the relay
    let s = shop().await;
    let (server, client, tools, journal) = s.serve_and_connect(&w, s.receiver()).await;
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "x")),
    )
    .await
    .expect("in time")
    .unwrap();
    assert_eq!(text(&r), "search: x");
    let meta = r.meta.as_ref().expect("the answer's _meta");
    assert!(meta.0.contains_key("stipendex/receipt"), "{meta:?}");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.balance(s.shop).await, 5, "5 cents to the shop");
    assert_eq!(s.balance(s.agent).await, 100_000 - 5);

    // The audit chain: mandate, Quote, Proof, Receipt — and it verifies.
    let names = journal.names();
    assert_eq!(names.len(), 1, "{names:?}");
    let chain = journal.chain(&names[0]);
    let objects: Vec<&str> = chain.iter().map(String::as_str).collect();
    let verified = stipendex::chain::verify_chain(&objects, None).expect("the chain verifies");
    let _ = verified;
    let kinds: Vec<String> = chain
        .iter()
        .filter_map(|j| stipendex::chain::claimed_kind(j))
        .collect();
    assert!(kinds.iter().any(|k| k.starts_with("receipt")), "{kinds:?}");
    assert!(kinds.iter().any(|k| k.starts_with("proof")), "{kinds:?}");
    client.cancel().await.unwrap();
    server.shutdown().await;
}

/// The wallet pays only a Quote for the call it sent, from the server it talks to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quote_for_another_call_or_from_another_server_is_not_paid() {
    let s = shop().await;
    let receiver = s.receiver();
    let server = Keys::generate().public_key();
    let origin = format!("nostr:{}", server.to_hex());
    let (wallet, _) = s.wallet(vec![origin.clone()]);
    let handler = StipendexHandler::new(wallet);
    let message = |q: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "search", "arguments": {"q": q}}})
    };
    let quote_for = |q: &str, origin: &str| {
        let req = stipendex::mcp::request(
            Some(origin),
            "tools/call",
            "search",
            message(q)["params"]["arguments"].as_object(),
        );
        let receiver = receiver.clone();
        async move {
            receiver
                .quote(
                    &req,
                    &stipendex::receiver::Price::Fixed(Money::parse(Asset::usd(), "0.05").unwrap()),
                    None,
                )
                .await
                .unwrap()
        }
    };
    let required = |jws: &str| PaymentRequired {
        amount: 5,
        pay_req: jws.to_owned(),
        pmi: "stipendex".into(),
        description: None,
        ttl: Some(60),
        meta: None,
    };
    let sent = |q: &str, to: nostr::PublicKey| PaidRequest {
        server: to,
        event_id: nostr::EventId::all_zeros(),
        message: message(q),
    };

    // A Quote made for another call (other arguments), relayed: refused.
    let other_call = quote_for("b", &origin).await;
    let err = handler
        .pay(&sent("a", server), &required(other_call.jws()))
        .await
        .unwrap_err();
    assert!(err.contains("another call"), "{err}");

    // A Quote for this call but made for another server (another origin): refused by the
    // mandate's origin pin.
    let elsewhere = Keys::generate().public_key();
    let theirs = quote_for("a", &format!("nostr:{}", elsewhere.to_hex())).await;
    let err = handler
        .pay(&sent("a", server), &required(theirs.jws()))
        .await
        .unwrap_err();
    assert!(err.contains("another call"), "{err}");
    // ... and presented as if from that server, the mandate does not pin it.
    let err = handler
        .pay(&sent("a", elsewhere), &required(theirs.jws()))
        .await
        .unwrap_err();
    assert!(err.contains("origin") || err.contains("not"), "{err}");

    // The right Quote for the call sent to this server: paid, the Proof to send back.
    let ours = quote_for("a", &origin).await;
    let note = handler
        .pay(&sent("a", server), &required(ours.jws()))
        .await
        .unwrap()
        .expect("the Proof notification");
    assert_eq!(note["method"], "notifications/stipendex/proof");
    assert!(note["params"]["proof"].as_str().unwrap().contains('.'));
    assert_eq!(s.balance(s.shop).await, 5);
}

/// A Proof admits one request: presented again for another request event (the same call), it is
/// refused; a Proof sent by another client for someone's pending request is not taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_admits_one_request_and_only_from_its_client() {
    use stipendex_contextvm::payments::server::Processor as _;
    use stipendex_contextvm::transport::server::Held;

    let s = shop().await;
    let server = Keys::generate().public_key();
    let processor = StipendexProcessor::new(s.receiver(), server);
    let (wallet, _) = s.wallet(vec![format!("nostr:{}", server.to_hex())]);
    let handler = StipendexHandler::new(wallet);
    let client = Keys::generate().public_key();
    let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "search", "arguments": {"q": "a"}}});
    let held = |event: [u8; 32]| Held {
        client,
        pmis: vec!["stipendex".into()],
        event_id: nostr::EventId::from_byte_array(event),
        interaction: None,
        message: message.clone(),
        hold: 0,
    };
    let price = Money::parse(Asset::usd(), "0.05").unwrap();
    let deadline = || Deadline::at(tokio::time::Instant::now() + Duration::from_secs(5));

    let a = held([1; 32]);
    let pending = processor
        .require(&price, None, Duration::from_secs(60), &a)
        .await
        .unwrap();
    let paid_req = PaidRequest {
        server,
        event_id: a.event_id,
        message: message.clone(),
    };
    let note = handler
        .pay(&paid_req, &pending.required)
        .await
        .unwrap()
        .unwrap();
    // Another client's copy of the Proof for this request: not taken.
    let mallory = Keys::generate().public_key();
    processor.delivered(&mallory, a.event_id, &note);
    assert!(
        processor
            .verify(
                &pending,
                &Deadline::at(tokio::time::Instant::now() + Duration::from_millis(300))
            )
            .await
            .is_err(),
        "a Proof from another client admitted the request"
    );

    // The client gives up on A (its answer lost); the same call again (request B) presents
    // A's Proof instead of paying B's Quote, then that Proof presented again for C is refused.
    handler.unanswered(&paid_req);
    let b = held([2; 32]);
    let pending_b = processor
        .require(&price, None, Duration::from_secs(60), &b)
        .await
        .unwrap();
    let note_b = handler
        .pay(
            &PaidRequest {
                server,
                event_id: b.event_id,
                message: message.clone(),
            },
            &pending_b.required,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(note_b, note, "B presents A's unused Proof");
    assert!(processor.delivered(&client, b.event_id, &note_b));
    processor.verify(&pending_b, &deadline()).await.unwrap();
    let mut answer = json!({"jsonrpc": "2.0", "id": b.event_id.to_hex(),
                            "result": {"content": [{"type": "text", "text": "search: a"}]}});
    processor.answered(b.event_id, &mut answer).await;
    assert!(answer["result"]["_meta"]["stipendex/receipt"].is_object());

    let c = held([3; 32]);
    let pending_c = processor
        .require(&price, None, Duration::from_secs(60), &c)
        .await
        .unwrap();
    assert!(processor.delivered(&client, c.event_id, &note_b));
    let replay = processor.verify(&pending_c, &deadline()).await;
    assert!(
        replay.is_err(),
        "a Proof admitted a second request: {replay:?}"
    );
    assert_eq!(
        s.balance(s.shop).await,
        5,
        "one payment (A's, presented for B), C not paid"
    );
}

/// At most once per Proof (the same rule as over HTTP and MCP): an instance admits a paid
/// `tools/call`, hands it to the server and stops before the answer; the same Proof presented to
/// another instance (the same store) once the claim lapses is told `outcome_unknown` — the call
/// is not handed to the server a second time, and nothing more is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_handed_over_by_a_stopped_instance_is_not_run_again() {
    use stipendex_contextvm::payments::server::Processor as _;
    use stipendex_contextvm::transport::server::Held;

    let s = shop().await;
    let server = Keys::generate().public_key();
    let receiver = || {
        Receiver::builder("shop", s.receiver_key.clone())
            .registry(&s.registry)
            .claim_lease(Duration::from_secs(1))
            .price(PricedCapability::fixed(
                "tools/call",
                "search",
                Money::parse(Asset::usd(), "0.05").unwrap(),
            ))
            .build()
            .unwrap()
    };
    let (wallet, _) = s.wallet(vec![format!("nostr:{}", server.to_hex())]);
    let handler = StipendexHandler::new(wallet);
    let client = Keys::generate().public_key();
    let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "search", "arguments": {"q": "a"}}});
    let held = |event: [u8; 32]| Held {
        client,
        pmis: vec!["stipendex".into()],
        event_id: nostr::EventId::from_byte_array(event),
        interaction: None,
        message: message.clone(),
        hold: 0,
    };
    let price = Money::parse(Asset::usd(), "0.05").unwrap();
    let deadline = || Deadline::at(tokio::time::Instant::now() + Duration::from_secs(5));

    // Instance 1 admits request A (the call goes to the server) and stops unanswered.
    let first = StipendexProcessor::new(receiver(), server);
    let a = held([1; 32]);
    let pending = first
        .require(&price, None, Duration::from_secs(60), &a)
        .await
        .unwrap();
    let paid_req = PaidRequest {
        server,
        event_id: a.event_id,
        message: message.clone(),
    };
    let note = handler
        .pay(&paid_req, &pending.required)
        .await
        .unwrap()
        .unwrap();
    assert!(first.delivered(&client, a.event_id, &note));
    first.verify(&pending, &deadline()).await.unwrap();
    drop(first);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // The client's retry (request B) presents the same Proof to instance 2.
    handler.unanswered(&paid_req);
    let second = StipendexProcessor::new(receiver(), server);
    let b = held([2; 32]);
    let pending_b = second
        .require(&price, None, Duration::from_secs(60), &b)
        .await
        .unwrap();
    let note_b = handler
        .pay(
            &PaidRequest {
                server,
                event_id: b.event_id,
                message: message.clone(),
            },
            &pending_b.required,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(note_b, note, "B presents A's Proof");
    assert!(second.delivered(&client, b.event_id, &note_b));
    let err = second
        .verify(&pending_b, &deadline())
        .await
        .expect_err("a call already handed to the server was admitted to run again");
    assert!(err.to_string().contains("outcome_unknown"), "{err}");
    assert_eq!(s.balance(s.shop).await, 5, "paid once");
}

/// An oversized Proof message is taken off the MCP server's path but never admits anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_proof_admits_nothing() {
    use stipendex_contextvm::payments::server::Processor as _;
    use stipendex_contextvm::transport::server::Held;

    let s = shop().await;
    let server = Keys::generate().public_key();
    let processor = StipendexProcessor::new(s.receiver(), server);
    let client = Keys::generate().public_key();
    let held = Held {
        client,
        pmis: vec!["stipendex".into()],
        event_id: nostr::EventId::from_byte_array([9; 32]),
        interaction: None,
        message: json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                        "params": {"name": "search", "arguments": {"q": "a"}}}),
        hold: 0,
    };
    let pending = processor
        .require(
            &Money::parse(Asset::usd(), "0.05").unwrap(),
            None,
            Duration::from_secs(60),
            &held,
        )
        .await
        .unwrap();
    let huge = json!({"jsonrpc": "2.0", "method": "notifications/stipendex/proof",
                      "params": {"proof": "a".repeat(70 * 1024)}});
    assert!(processor.delivered(&client, held.event_id, &huge));
    let verdict = processor
        .verify(
            &pending,
            &Deadline::at(tokio::time::Instant::now() + Duration::from_millis(300)),
        )
        .await;
    assert!(verdict.is_err(), "an oversized Proof admitted the request");
    assert_eq!(s.balance(s.shop).await, 0);
}

/// The receiver engine over ContextVM: a paid call is decided once (the transport's hold,
/// read again by the payments' admission: one `Receiver::decide`) and asks the price hook
/// once (for the Quote sent as `pay_req`); the Proof that comes back is served by the engine
/// (`Receiver::serve_proof`), which prices nothing again. Before, the hold and the admission
/// each decided.
#[tokio::test]
async fn over_contextvm_a_paid_call_decides_once_and_asks_the_hook_once() {
    use std::sync::atomic::AtomicUsize;
    let w = common::world().await; // the relay
    let s = shop().await;
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let receiver = s
        .receiver_builder()
        .resolve_price(Arc::new(
            move |cap: &PricedCapability, _: &stipendex::receiver::Request| {
                counted.fetch_add(1, Ordering::SeqCst);
                stipendex::receiver::Decision::quote(cap.price.clone())
            },
        ))
        .build()
        .unwrap();
    let decisions = test_kit::events::Events::count("stipendex::decide");
    let (server, client, tools, _) = s.serve_and_connect(&w, receiver).await;
    decisions.take();
    for q in ["a", "b"] {
        let r = tokio::time::timeout(Duration::from_secs(20), client.call_tool(call("search", q)))
            .await
            .expect("in time")
            .unwrap();
        assert_eq!(text(&r), format!("search: {q}"));
        assert!(r.meta.as_ref().unwrap().0.contains_key("stipendex/receipt"));
    }
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2);
    assert_eq!(decisions.take(), 2, "one decision per paid call");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        2,
        "the hook once per paid call"
    );
    client.cancel().await.unwrap();
    server.shutdown().await;
}
