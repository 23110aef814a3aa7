#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! The receiver surfaces end to end: the example app (HTTP paywall, discovery, MCP) in front of
//! a devnet, paid by the exact-algo payer over real HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use algod_devnet::example::{POSTS, example_app};
use algod_devnet::{Devnet, DevnetConfig, RunningDevnet};
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_core::{ManualClock, MemoryKeyStore, SharedClock};
use rail_exact_algo::txn::PayTxn;
use rail_exact_algo::wire::{self, Envelope, Payload, PaymentRequired, PaymentResponse};
use rail_exact_algo::{Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

const START: u64 = 5_000_000;
const TREASURY: u64 = 100_000;

struct Env {
    net: RunningDevnet,
    algod: AlgodClient,
    payer: ExactAlgoPayer,
    receiver: ExactAlgoReceiver,
    treasury: Address,
    base: String,
    http: reqwest::Client,
    _server: tokio::task::JoinHandle<()>,
}

async fn serve(app: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let local = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (format!("http://{local}"), task)
}

fn client() -> reqwest::Client {
    rail_exact_algo::algod::http_client(Duration::from_secs(30)).unwrap()
}

async fn setup() -> Env {
    let payer_key = key(1);
    let treasury = addr(&key(2));
    let cfg = DevnetConfig {
        accounts: vec![(addr(&payer_key), START), (treasury, TREASURY)],
        token: Some("t0ken".into()),
        ..DevnetConfig::default()
    };
    let net = Devnet::spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let algod = AlgodClient::new(&net.url, Some("t0ken".into())).unwrap();
    let clock: SharedClock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(MemoryKeyStore::with_clock(clock.clone()));
    let receiver =
        ExactAlgoReceiver::connect(algod.clone(), treasury, store.clone(), clock.clone())
            .await
            .unwrap();
    let payer = ExactAlgoPayer::new(
        payer_key,
        algod.clone(),
        Policy::default(),
        store.clone(),
        clock,
    );
    let (base, server) = serve(example_app(&receiver, 1000)).await;
    Env {
        net,
        algod,
        payer,
        receiver,
        treasury,
        base,
        http: client(),
        _server: server,
    }
}

impl Env {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn get(&self, path: &str, payment: Option<&str>) -> reqwest::Response {
        let mut r = self.http.get(self.url(path));
        if let Some(p) = payment {
            r = r.header("PAYMENT-SIGNATURE", p);
        }
        r.send().await.unwrap()
    }

    /// A 402, checked and parsed.
    async fn challenge(&self, path: &str, payment: Option<&str>) -> PaymentRequired {
        let resp = self.get(path, payment).await;
        assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
        let header = resp
            .headers()
            .get("PAYMENT-REQUIRED")
            .expect("PAYMENT-REQUIRED header")
            .to_str()
            .unwrap()
            .to_owned();
        let body = resp.bytes().await.unwrap();
        assert_eq!(BASE64.decode(header.as_bytes()).unwrap(), body.to_vec());
        serde_json::from_slice(&body).unwrap()
    }

    async fn mcp(&self, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url("/mcp"))
            .header("Accept", "application/json, text/event-stream")
            .json(body)
            .send()
            .await
            .unwrap()
    }

    async fn rpc(&self, id: u64, method: &str, params: Value) -> Value {
        let resp = self
            .mcp(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert_eq!(resp.status(), StatusCode::OK);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["id"], id);
        v
    }

    fn treasury_balance(&self) -> u64 {
        self.net.devnet.balance(&self.treasury)
    }

    /// A payment for `accept` built by hand, with `amount` to `receiver`.
    async fn hand_made(&self, required: &PaymentRequired, amount: u64, to: Address) -> String {
        let a = &required.accepts[0];
        let p = self.algod.params().await.unwrap();
        let first_valid = p.last_round.max(1);
        let txn = PayTxn {
            sender: self.payer.address(),
            receiver: to,
            amount,
            fee: 1000,
            first_valid,
            last_valid: first_valid + 1000,
            genesis_id: p.genesis_id,
            genesis_hash: p.genesis_hash,
            note: a.extra.payment_id.as_bytes().to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        };
        let signed = txn.sign(&key(1), None);
        wire::header(&Envelope {
            x402_version: 2,
            scheme: "exact".into(),
            network: a.network.clone(),
            payload: Payload {
                txn: BASE64.encode(&signed.encode()),
            },
        })
        .unwrap()
    }
}

fn is_pid(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test]
async fn a_priced_route_answers_the_seeds_402() {
    let env = setup().await;
    let resp = env.get("/api/posts/1", None).await;
    assert_eq!(
        resp.headers()
            .get("cache-control")
            .unwrap()
            .to_str()
            .unwrap(),
        "no-store"
    );
    let pr = env.challenge("/api/posts/1", None).await;
    assert_eq!(pr.x402_version, 2);
    assert_eq!(pr.error, "payment required");
    assert_eq!(pr.accepts.len(), 1);
    let a = &pr.accepts[0];
    assert_eq!(a.scheme, "exact");
    assert_eq!(a.network, env.receiver.network());
    assert_eq!(a.network, env.net.devnet.network());
    assert!(a.network.starts_with("algorand:"));
    assert_eq!(a.asset, "ALGO");
    assert_eq!(a.max_amount_required, "1000");
    assert_eq!(a.resource, "/api/posts/1");
    assert_eq!(a.description, "read post body");
    assert_eq!(a.pay_to, env.treasury.to_string());
    assert_eq!(a.max_timeout_seconds, 120);
    assert!(is_pid(&a.extra.payment_id));
    assert_eq!(a.extra.min_fee_micro_algo, 1000);
    // The raw JSON uses the key names of `docs/exact-algo.md` §2.2.
    let raw: Value =
        serde_json::from_slice(&env.get("/api/posts/1", None).await.bytes().await.unwrap())
            .unwrap();
    for k in [
        "scheme",
        "network",
        "asset",
        "maxAmountRequired",
        "resource",
        "description",
        "payTo",
        "maxTimeoutSeconds",
    ] {
        assert!(raw["accepts"][0].get(k).is_some(), "{k}");
    }
    assert!(is_pid(
        raw["accepts"][0]["extra"]["paymentId"].as_str().unwrap()
    ));
    assert_eq!(raw["accepts"][0]["extra"]["minFeeMicroAlgo"], 1000);
    // Each challenge is fresh.
    let again = env.challenge("/api/posts/1", None).await;
    assert_ne!(again.accepts[0].extra.payment_id, a.extra.payment_id);
    // Free and unknown paths are not priced.
    let index = env.get("/api/posts", None).await;
    assert_eq!(index.status(), StatusCode::OK);
    let index: Value = index.json().await.unwrap();
    assert_eq!(index["posts"].as_array().unwrap().len(), POSTS.len());
    assert!(index["posts"][0].get("body").is_none());
    assert_eq!(
        env.get("/api/posts/99", None).await.status(),
        StatusCode::NOT_FOUND
    );
    // Another spelling of a priced path is priced too.
    let encoded = env.challenge("/api/posts/%31", None).await;
    assert_eq!(encoded.accepts[0].resource, "/api/posts/%31");
}

#[tokio::test]
async fn paying_unlocks_once_and_a_replay_gets_a_fresh_challenge() {
    let env = setup().await;
    let pr = env.challenge("/api/posts/2", None).await;
    let signed = env.payer.pay_required(&pr).await.unwrap();
    let resp = env.get("/api/posts/2", Some(&signed.header)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()
            .get("cache-control")
            .unwrap()
            .to_str()
            .unwrap(),
        "private, no-store"
    );
    let receipt = resp
        .headers()
        .get("PAYMENT-RESPONSE")
        .unwrap()
        .to_str()
        .unwrap();
    let receipt: PaymentResponse =
        serde_json::from_slice(&BASE64.decode(receipt.as_bytes()).unwrap()).unwrap();
    assert!(receipt.success);
    assert_eq!(receipt.transaction, signed.txid);
    assert_eq!(receipt.payer, env.payer.address().to_string());
    assert_eq!(receipt.amount, "1000");
    assert_eq!(receipt.network, env.receiver.network());
    assert!(receipt.confirmed_round > 0);
    let post: Value = resp.json().await.unwrap();
    assert_eq!(post["body"], POSTS[1].body);
    assert_eq!(env.treasury_balance(), TREASURY + 1000);
    assert_eq!(
        env.net.devnet.balance(&env.payer.address()),
        START - 1000 - 1000
    );

    // The same header again: refused, with a fresh, different paymentId. One of the six codes
    // names the case (`docs/exact-algo.md` §4.1): no finer reason, the body is exactly the plain
    // shape of §2.1.
    let replay = env.challenge("/api/posts/2", Some(&signed.header)).await;
    assert_eq!(replay.error, "paymentId already used");
    assert_eq!(replay.reason, None);
    assert!(is_pid(&replay.accepts[0].extra.payment_id));
    assert_ne!(
        replay.accepts[0].extra.payment_id,
        pr.accepts[0].extra.payment_id
    );
    assert_eq!(env.treasury_balance(), TREASURY + 1000);

    // A payment for post 2 does not unlock post 3.
    let pr3 = env.challenge("/api/posts/3", None).await;
    let signed3 = env.payer.pay_required(&pr3).await.unwrap();
    let cross = env.challenge("/api/posts/1", Some(&signed3.header)).await;
    assert_eq!(cross.error, "unknown or expired paymentId");
    assert_eq!(env.treasury_balance(), TREASURY + 1000);
    // …and still settles where it belongs.
    let ok = env.get("/api/posts/3", Some(&signed3.header)).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(env.treasury_balance(), TREASURY + 2000);
}

#[tokio::test]
async fn rule_violations_are_402s_with_their_codes() {
    let env = setup().await;
    let pr = env.challenge("/api/posts/1", None).await;
    let underpaid = env.hand_made(&pr, 999, env.treasury).await;
    let r = env.challenge("/api/posts/1", Some(&underpaid)).await;
    assert_eq!(r.error, "underpaid");
    assert_eq!(r.reason, None);
    assert_ne!(
        r.accepts[0].extra.payment_id,
        pr.accepts[0].extra.payment_id
    );

    let pr = env.challenge("/api/posts/1", None).await;
    let elsewhere = env.hand_made(&pr, 1000, addr(&key(9))).await;
    let r = env.challenge("/api/posts/1", Some(&elsewhere)).await;
    assert_eq!(r.error, "receiver mismatch");

    // A finer case: one of the six codes as error, the finer one as reason (`docs/exact-algo.md`
    // §4.2), in the body and in PAYMENT-REQUIRED alike.
    let pr = env.challenge("/api/posts/1", None).await;
    let mut bad_sig = env.hand_made(&pr, 1000, env.treasury).await;
    bad_sig = {
        let mut e: Value =
            serde_json::from_slice(&BASE64.decode(bad_sig.as_bytes()).unwrap()).unwrap();
        let mut raw = BASE64
            .decode(e["payload"]["txn"].as_str().unwrap().as_bytes())
            .unwrap();
        // The signature is the first field ("sig", after the map and key bytes).
        raw[10] ^= 1;
        e["payload"]["txn"] = json!(BASE64.encode(&raw));
        wire::header(&e).unwrap()
    };
    let resp = env.get("/api/posts/1", Some(&bad_sig)).await;
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    let raw: Value = resp.json().await.unwrap();
    assert_eq!(raw["error"], "settlement failed");
    assert_eq!(raw["reason"], "bad signature");
    let r = env.challenge("/api/posts/1", Some(&bad_sig)).await;
    assert_eq!(
        (r.error.as_str(), r.reason.as_deref()),
        ("settlement failed", Some("bad signature"))
    );

    // A well-formed hand-made payment settles (the refusals above did not burn the challenge).
    let good = env.hand_made(&pr, 1000, env.treasury).await;
    assert_eq!(env.treasury_balance(), TREASURY);
    let resp = env.get("/api/posts/1", Some(&good)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(env.treasury_balance(), TREASURY + 1000);
}

#[tokio::test]
async fn garbage_headers_are_402_never_5xx() {
    let env = setup().await;
    let not_envelope = BASE64.encode(b"{}");
    let wrong_version = wire::header(&json!({"x402Version": 1, "scheme": "exact",
        "network": env.receiver.network(), "payload": {"txn": "gA=="}}))
    .unwrap();
    let wrong_network = wire::header(&json!({"x402Version": 2, "scheme": "exact",
        "network": "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe", "payload": {"txn": "gA=="}}))
    .unwrap();
    for (h, reason) in [
        ("garbage!", "malformed payment"),
        ("", "malformed payment"),
        (not_envelope.as_str(), "malformed payment"),
        (wrong_version.as_str(), "malformed payment"),
        (wrong_network.as_str(), "wrong network"),
    ] {
        let r = env.challenge("/api/posts/1", Some(h)).await;
        assert_eq!(r.error, "settlement failed", "{h:?}");
        assert_eq!(r.reason.as_deref(), Some(reason), "{h:?}");
    }
    // Not visible ASCII.
    let resp = env
        .http
        .get(env.url("/api/posts/1"))
        .header(
            "PAYMENT-SIGNATURE",
            reqwest::header::HeaderValue::from_bytes(b"\xff\xfe").unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    let r: PaymentRequired = resp.json().await.unwrap();
    assert_eq!(r.error, "settlement failed");
    assert_eq!(r.reason.as_deref(), Some("malformed payment"));
    // Two payment headers.
    let resp = env
        .http
        .get(env.url("/api/posts/1"))
        .header("PAYMENT-SIGNATURE", "a")
        .header("PAYMENT-SIGNATURE", "b")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(env.treasury_balance(), TREASURY);
}

#[tokio::test]
async fn head_is_never_charged() {
    let env = setup().await;
    let resp = env.http.head(env.url("/api/posts/1")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    let header = resp
        .headers()
        .get("PAYMENT-REQUIRED")
        .unwrap()
        .to_str()
        .unwrap();
    let pr: PaymentRequired =
        serde_json::from_slice(&BASE64.decode(header.as_bytes()).unwrap()).unwrap();
    assert_eq!(pr.error, "payment required");
    assert_eq!(pr.reason, None);
    assert!(resp.bytes().await.unwrap().is_empty());

    let pr = env.challenge("/api/posts/1", None).await;
    let signed = env.payer.pay_required(&pr).await.unwrap();
    let resp = env
        .http
        .head(env.url("/api/posts/1"))
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    assert!(resp.headers().get("PAYMENT-RESPONSE").is_none());
    assert_eq!(env.treasury_balance(), TREASURY);
    assert_eq!(env.net.devnet.balance(&env.payer.address()), START);
    // The payment was not consumed: a GET settles it.
    let resp = env.get("/api/posts/1", Some(&signed.header)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(env.treasury_balance(), TREASURY + 1000);
}

#[tokio::test]
async fn discovery_documents_describe_the_scheme() {
    let env = setup().await;
    let resp = env.get("/llms.txt", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let txt = resp.text().await.unwrap();
    for needle in [
        "exact-algo",
        "NOT the x402 standard",
        "/api/posts/{id}: 1000 microALGO",
        "post_read: 1000 microALGO",
        "POST /mcp",
        "PAYMENT-SIGNATURE",
        "/.well-known/exact-algo.json",
        &env.treasury.to_string(),
        env.receiver.network(),
    ] {
        assert!(txt.contains(needle), "llms.txt lacks {needle:?}:\n{txt}");
    }

    let resp = env.get("/.well-known/exact-algo.json", None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let doc: Value = resp.json().await.unwrap();
    assert_eq!(doc["scheme"], "exact");
    assert_eq!(doc["x402Version"], 2);
    assert_eq!(doc["x402Standard"], false);
    assert_eq!(doc["network"], env.receiver.network());
    assert_eq!(doc["asset"], "ALGO");
    assert_eq!(doc["payTo"], env.treasury.to_string());
    assert_eq!(
        doc["envelope"]["keys"],
        json!(["x402Version", "scheme", "network", "payload.txn"])
    );
    assert_eq!(doc["headers"]["payment"], "PAYMENT-SIGNATURE");
    assert_eq!(doc["headers"]["challenge"], "PAYMENT-REQUIRED");
    assert_eq!(doc["headers"]["receipt"], "PAYMENT-RESPONSE");
    let rules = doc["rules"].as_array().unwrap();
    assert!(rules.len() >= 7);
    // Each rule lists its codes as the wire carries them: the six-code error, and the finer
    // reason beside it where there is one (`docs/exact-algo.md` §3, §4).
    let rule_codes: Vec<&Value> = rules
        .iter()
        .flat_map(|r| r["errors"].as_array().unwrap())
        .collect();
    for c in [
        json!({"error": "underpaid"}),
        json!({"error": "receiver mismatch"}),
        json!({"error": "transaction expired"}),
        json!({"error": "settlement failed", "reason": "rekey not allowed"}),
        json!({"error": "transaction expired", "reason": "validity window too long"}),
    ] {
        assert!(rule_codes.contains(&&c), "{c}");
    }
    let seed = [
        "underpaid",
        "receiver mismatch",
        "unknown or expired paymentId",
        "paymentId already used",
        "transaction expired",
        "settlement failed",
    ];
    assert_eq!(doc["seedErrors"], json!(seed));
    let errors = doc["errors"].as_array().unwrap();
    let codes: Vec<(&str, Option<&str>)> = errors
        .iter()
        .map(|e| (e["error"].as_str().unwrap(), e["reason"].as_str()))
        .collect();
    for c in seed {
        assert!(codes.contains(&(c, None)), "{c}");
    }
    for (error, reason) in [
        ("settlement failed", "malformed payment"),
        ("settlement failed", "wrong network"),
        ("settlement failed", "fee too high"),
        ("settlement failed", "bad signature"),
        ("transaction expired", "transaction not yet valid"),
        ("unknown or expired paymentId", "note mismatch"),
        ("settlement failed", "settlement in progress"),
    ] {
        assert!(codes.contains(&(error, Some(reason))), "{error} / {reason}");
    }
    // Every error is one of the six codes (or "payment required"); exactly the rows of
    // `docs/exact-algo.md` §4.1 are marked.
    for e in errors {
        let error = e["error"].as_str().unwrap();
        assert!(seed.contains(&error) || error == "payment required", "{e}");
        assert_eq!(
            e["seed"],
            seed.contains(&error) && e.get("reason").is_none(),
            "{e}"
        );
    }
    assert!(
        txt.contains("- settlement failed / reason fee too high:"),
        "{txt}"
    );
    assert_eq!(doc["prices"]["http"][0]["resource"], "/api/posts/{id}");
    assert_eq!(doc["prices"]["http"][0]["maxAmountRequired"], "1000");
    assert_eq!(doc["prices"]["mcp"][0]["tool"], "post_read");
    assert_eq!(doc["prices"]["mcp"][0]["maxAmountRequired"], "1000");
    assert_eq!(doc["mcp"]["endpoint"], "/mcp");
    // Discovery is free.
    assert_eq!(env.treasury_balance(), TREASURY);
}

#[tokio::test]
async fn mcp_handshake_and_free_tools() {
    let env = setup().await;
    let init = env
        .rpc(
            1,
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "0"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    assert!(init["result"]["capabilities"]["tools"].is_object());
    assert!(init["result"]["serverInfo"]["name"].is_string());
    assert!(init["result"]["serverInfo"]["version"].is_string());

    let note = env
        .mcp(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert_eq!(note.status(), StatusCode::ACCEPTED);
    assert!(note.bytes().await.unwrap().is_empty());

    let list = env.rpc(2, "tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in ["board_index", "payment_instructions", "post_read"] {
        assert!(names.contains(&n), "{n}");
    }
    for t in tools {
        assert!(t["inputSchema"].is_object());
        assert!(t["description"].is_string());
    }
    let post_read = tools.iter().find(|t| t["name"] == "post_read").unwrap();
    assert_eq!(
        post_read["_meta"]["x402/price"]["maxAmountRequired"],
        "1000"
    );

    let index = env
        .rpc(
            3,
            "tools/call",
            json!({"name": "board_index", "arguments": {}}),
        )
        .await;
    assert_eq!(index["result"]["isError"], false);
    assert_eq!(
        index["result"]["structuredContent"]["posts"]
            .as_array()
            .unwrap()
            .len(),
        POSTS.len()
    );
    assert_eq!(index["result"]["content"][0]["type"], "text");

    let instr = env
        .rpc(4, "tools/call", json!({"name": "payment_instructions"}))
        .await;
    let doc = &instr["result"]["structuredContent"];
    assert_eq!(instr["result"]["isError"], false);
    assert_eq!(doc["scheme"], "exact");
    assert_eq!(doc["asset"], "ALGO");
    assert_eq!(doc["network"], env.receiver.network());
    assert!(doc["client_procedure"].as_array().unwrap().len() >= 6);
    assert!(!doc["errors"].as_array().unwrap().is_empty());
    assert_eq!(doc["prices"]["http"][0]["resource"], "/api/posts/{id}");
    assert_eq!(doc["prices"]["mcp"][0]["tool"], "post_read");

    let ping = env.rpc(5, "ping", json!({})).await;
    assert_eq!(ping["result"], json!({}));

    let unknown = env.rpc(6, "resources/list", json!({})).await;
    assert_eq!(unknown["error"]["code"], -32601);

    let no_tool = env
        .rpc(7, "tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(no_tool["error"]["code"], -32602);

    let resp = env
        .http
        .post(env.url("/mcp"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    // rmcp's Streamable HTTP transport refuses unparsable JSON with a 4xx, never a 5xx.
    assert!(resp.status().is_client_error(), "{}", resp.status());

    // A cross-origin browser page may not drive the server.
    let resp = env
        .http
        .post(env.url("/mcp"))
        .header("Origin", "https://evil.example")
        .json(&json!({"jsonrpc": "2.0", "id": 8, "method": "ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(env.treasury_balance(), TREASURY);
}

#[tokio::test]
async fn mcp_paid_tool_challenge_pay_and_replay() {
    let env = setup().await;
    let call = |id: u64, meta: Option<&str>, post: &str| {
        let mut params = json!({"name": "post_read", "arguments": {"post_id": post}});
        if let Some(m) = meta {
            params["_meta"] = json!({"x402/payment": m});
        }
        (id, params)
    };
    let (id, params) = call(1, None, "1");
    let unpaid = env.rpc(id, "tools/call", params).await;
    let result = &unpaid["result"];
    assert_eq!(result["isError"], true);
    let sc = &result["structuredContent"];
    assert_eq!(sc["x402Version"], 2);
    assert_eq!(sc["error"], "payment required");
    assert_eq!(sc["how_to_pay"]["tool"], "payment_instructions");
    assert_eq!(sc["how_to_pay"]["scheme"], "exact-algo");
    assert_eq!(sc["accepts"][0]["resource"], "post_read");
    assert_eq!(sc["accepts"][0]["maxAmountRequired"], "1000");
    assert!(is_pid(
        sc["accepts"][0]["extra"]["paymentId"].as_str().unwrap()
    ));
    // The text is x402's MCP wrapper around the same requirement.
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text["x402/error"]["data"], sc);
    assert_eq!(text["x402/error"]["code"], 402);

    // The agent pays what the result asks for and retries the same call.
    let pr: PaymentRequired = serde_json::from_value(sc.clone()).unwrap();
    let signed = env.payer.pay_required(&pr).await.unwrap();
    let (id, params) = call(2, Some(&signed.header), "1");
    let paid = env.rpc(id, "tools/call", params.clone()).await;
    let result = &paid["result"];
    assert_eq!(result["isError"], false, "{paid}");
    let sc = &result["structuredContent"];
    assert_eq!(sc["post"]["body"], POSTS[0].body);
    assert_eq!(sc["receipt"]["success"], true);
    assert_eq!(sc["receipt"]["transaction"], signed.txid.as_str());
    assert_eq!(sc["receipt"]["payer"], env.payer.address().to_string());
    assert_eq!(sc["receipt"]["amount"], "1000");
    assert!(sc["receipt"]["confirmedRound"].as_u64().unwrap() > 0);
    let meta: PaymentResponse =
        serde_json::from_value(result["_meta"]["x402/payment-response"].clone()).unwrap();
    assert_eq!(meta.transaction, signed.txid);
    assert_eq!(env.treasury_balance(), TREASURY + 1000);

    // Replay: refused with a fresh challenge.
    let replay = env.rpc(3, "tools/call", params).await;
    let result = &replay["result"];
    assert_eq!(result["isError"], true);
    let sc = &result["structuredContent"];
    assert_eq!(sc["error"], "paymentId already used");
    assert!(sc.get("reason").is_none(), "{sc}");
    assert_ne!(
        sc["accepts"][0]["extra"]["paymentId"],
        pr.accepts[0].extra.payment_id.as_str()
    );
    assert_eq!(sc["how_to_pay"]["tool"], "payment_instructions");
    assert_eq!(env.treasury_balance(), TREASURY + 1000);

    // An HTTP challenge's payment does not unlock the tool.
    let http_pr = env.challenge("/api/posts/1", None).await;
    let http_signed = env.payer.pay_required(&http_pr).await.unwrap();
    let (id, params) = call(4, Some(&http_signed.header), "1");
    let cross = env.rpc(id, "tools/call", params).await;
    assert_eq!(
        cross["result"]["structuredContent"]["error"],
        "unknown or expired paymentId"
    );

    // A call that cannot succeed asks for no payment.
    let (id, params) = call(5, None, "99");
    let missing = env.rpc(id, "tools/call", params).await;
    assert_eq!(missing["result"]["isError"], true);
    assert!(
        missing["result"]["structuredContent"]
            .get("accepts")
            .is_none()
    );
    let none = env
        .rpc(
            6,
            "tools/call",
            json!({"name": "post_read", "arguments": {}}),
        )
        .await;
    assert_eq!(none["result"]["isError"], true);
    assert!(none["result"]["structuredContent"].get("accepts").is_none());

    // A garbage payment is a refusal with a fresh challenge.
    let (id, params) = call(7, Some("garbage"), "1");
    let garbage = env.rpc(id, "tools/call", params).await;
    assert_eq!(
        garbage["result"]["structuredContent"]["error"],
        "settlement failed"
    );
    assert_eq!(
        garbage["result"]["structuredContent"]["reason"],
        "malformed payment"
    );
    assert!(garbage["result"]["structuredContent"]["accepts"][0].is_object());
    assert_eq!(env.treasury_balance(), TREASURY + 1000);
}

#[tokio::test]
async fn an_unreachable_algod_is_a_503_and_the_same_payment_settles_later() {
    let payer_key = key(1);
    let treasury = addr(&key(2));
    let cfg = DevnetConfig {
        accounts: vec![(addr(&payer_key), START), (treasury, TREASURY)],
        ..DevnetConfig::default()
    };
    let devnet = Devnet::new(cfg);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let algod_addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let algod_server = tokio::spawn(
        axum::serve(listener, devnet.router())
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .into_future(),
    );
    let algod = AlgodClient::new(&format!("http://{algod_addr}"), None).unwrap();
    let clock: SharedClock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(MemoryKeyStore::with_clock(clock.clone()));
    let receiver =
        ExactAlgoReceiver::connect(algod.clone(), treasury, store.clone(), clock.clone())
            .await
            .unwrap();
    let payer = ExactAlgoPayer::new(payer_key, algod, Policy::default(), store.clone(), clock);
    let (base, _server) = serve(example_app(&receiver, 1000)).await;
    let http = client();
    let url = format!("{base}/api/posts/1");
    let resp = http.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    let pr: PaymentRequired = resp.json().await.unwrap();
    let signed = payer.pay_required(&pr).await.unwrap();

    // algod goes away.
    stop.send(()).unwrap();
    algod_server.await.unwrap().unwrap();
    let resp = http
        .get(&url)
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        resp.headers().get("retry-after").unwrap().to_str().unwrap(),
        "2"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "settlement failed");
    assert_eq!(body["reason"], "algod unavailable");
    assert_eq!(body["retryable"], true);
    assert_eq!(devnet.balance(&treasury), TREASURY);

    // algod is back on the same address: the same payment settles.
    let listener = tokio::net::TcpListener::bind(algod_addr).await.unwrap();
    let _algod_again = tokio::spawn(axum::serve(listener, devnet.router()).into_future());
    let resp = http
        .get(&url)
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(devnet.balance(&treasury), TREASURY + 1000);
}
