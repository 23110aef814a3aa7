//! Facilitator authentication checked by an independent implementation: a local x402
//! facilitator (the in-memory token behind this crate's facilitator API) that, like Coinbase's
//! hosted one, refuses every request whose `Authorization` is not a valid CDP API-key JWT for
//! that very request — judged by PyPI's PyJWT (with `cryptography`), driven through
//! `scripts/cdp_jwt.py`, which also makes the API keys as the CDP portal hands them out.
//!
//! - Ed25519 (base64) and EC P-256 (SEC1 and PKCS#8 PEM, and a PEM written with literal `\n`)
//!   keys are accepted: `supported`, `verify` and `settle` each carry a fresh token (the
//!   verifier refuses a nonce it has seen) whose `uris` names the request's method, host and
//!   path, and a real payment settles.
//! - No credentials, a wrong key, a wrong key id or a plain bearer token are refused with
//!   401, which the client reports in one sentence as a non-retryable error; nothing settles.
//!
//! It needs a Python with PyJWT: the virtualenv `${ALGOJIG_VENV:-/var/tmp/algojig-venv}`
//! (`scripts/setup-localnets` installs PyJWT there), else `python3`. Without one the tests
//! print a line starting with `SKIPPED:`; in CI (`CI=true`) they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::print_stderr,
    missing_docs,
    unreachable_pub
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alloy_primitives::{Address, U256};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{
    Bearer, CdpAuth, FacilitatorAuth, FacilitatorError, RemoteFacilitator, X402Facilitator,
};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::{ExactEvm, Token};
use serde_json::{Value, json};
use test_kit::localnet::in_ci;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use x402_devnet::DevnetFacilitator;

const WHAT: &str = "PyPI PyJWT (independent JWT implementation)";
const KEY_ID: &str = "organizations/0b1e3c5a-7f00-4d8e-9c11-5a2b7e1d9f00/apiKeys/4c7d1e2f-0a9b-4c3d-8e7f-6a5b4c3d2e1f";
const HINT: &str = "check the API key named by cdp_key_id_env/cdp_key_secret_env";
const PRICE: u64 = 10_000;

fn token() -> Token {
    Token::new("eip155:84532", Address::repeat_byte(0x5c), "USDC", "2")
}

fn candidates() -> Vec<PathBuf> {
    let venv = std::env::var("ALGOJIG_VENV").unwrap_or_else(|_| "/var/tmp/algojig-venv".into());
    vec![
        PathBuf::from(venv).join("bin/python"),
        PathBuf::from("python3"),
    ]
}

/// A Python that imports PyJWT 2 with `cryptography`; `None` after saying SKIPPED (or a panic
/// in CI).
fn python_with_pyjwt() -> Option<PathBuf> {
    let tried = candidates();
    for python in &tried {
        let ok = std::process::Command::new(python)
            .args([
                "-c",
                "import jwt, cryptography.hazmat.primitives.asymmetric.ed25519; assert jwt.__version__.startswith('2.')",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(python.clone());
        }
    }
    let why = format!(
        "none of {} imports PyJWT 2 with cryptography; scripts/setup-localnets installs them (or: pip install pyjwt cryptography)",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(!in_ci(), "{WHAT} is required in CI but unavailable: {why}");
    eprintln!("SKIPPED: {WHAT} unavailable ({why})");
    None
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/cdp_jwt.py")
}

/// A CDP-style API key made by Python's `cryptography`.
struct Key {
    secret: String,
    kty: String,
    public: String,
}

fn keygen(python: &PathBuf, kind: &str) -> Key {
    let out = std::process::Command::new(python)
        .arg(script())
        .args(["keygen", kind])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cdp_jwt.py keygen {kind}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    Key {
        secret: v["secret"].as_str().unwrap().to_owned(),
        kty: v["kty"].as_str().unwrap().to_owned(),
        public: v["public"].as_str().unwrap().to_owned(),
    }
}

/// `cdp_jwt.py verify`: one request's headers in, PyJWT's verdict out.
struct Verifier {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Verifier {
    async fn start(python: &PathBuf, key_id: &str, key: &Key) -> Self {
        let mut child = Command::new(python)
            .arg(script())
            .args(["verify", key_id, &key.kty, &key.public])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready: Value =
            serde_json::from_str(&stdout.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(ready["ready"], true, "{ready}");
        Verifier {
            _child: child,
            stdin,
            stdout,
        }
    }

    async fn check(&mut self, request: Value) -> Result<(), String> {
        let mut line = request.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        let answer: Value =
            serde_json::from_str(&self.stdout.next_line().await.unwrap().unwrap()).unwrap();
        if answer["ok"] == true {
            Ok(())
        } else {
            Err(answer["error"].as_str().unwrap_or("refused").to_owned())
        }
    }
}

/// Every request the facilitator saw: `(method host/path, PyJWT's verdict)`.
type Seen = Arc<Mutex<Vec<(String, Result<(), String>)>>>;

#[derive(Clone)]
struct Gate {
    verifier: Arc<tokio::sync::Mutex<Verifier>>,
    /// Every request's `(uri, verdict)`: what the facilitator saw.
    seen: Seen,
}

/// The facilitator's authentication, in front of its routes: 401 unless PyJWT accepts.
async fn require_jwt(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    let verdict = gate
        .verifier
        .lock()
        .await
        .check(
            json!({"authorization": authorization, "method": method, "host": host, "path": path}),
        )
        .await;
    gate.seen
        .lock()
        .unwrap()
        .push((format!("{method} {host}{path}"), verdict.clone()));
    match verdict {
        Ok(()) => next.run(req).await,
        Err(why) => (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"errorType": "unauthorized", "errorMessage": why})),
        )
            .into_response(),
    }
}

/// A facilitator over the in-memory token that requires a JWT of `key` (id `key_id`).
struct Facilitator {
    url: String,
    devnet: Arc<DevnetFacilitator>,
    seen: Seen,
}

impl Facilitator {
    async fn start(python: &PathBuf, key_id: &str, key: &Key) -> Self {
        let devnet = Arc::new(DevnetFacilitator::new("eip155:84532"));
        let gate = Gate {
            verifier: Arc::new(tokio::sync::Mutex::new(
                Verifier::start(python, key_id, key).await,
            )),
            seen: Arc::default(),
        };
        let app = rail_x402::server::router(devnet.clone()).layer(
            axum::middleware::from_fn_with_state(gate.clone(), require_jwt),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Facilitator {
            url,
            devnet,
            seen: gate.seen,
        }
    }

    fn client(&self, auth: Option<Arc<dyn FacilitatorAuth>>) -> RemoteFacilitator {
        let f = RemoteFacilitator::new(&self.url, Duration::from_secs(10)).unwrap();
        match auth {
            Some(a) => f.with_auth(a),
            None => f,
        }
    }

    fn host(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    fn seen(&self) -> Vec<(String, Result<(), String>)> {
        self.seen.lock().unwrap().clone()
    }
}

/// A payment of `PRICE` to `pay_to` by a funded payer, as a paywall would pass it on.
fn payment(
    f: &Facilitator,
    pay_to: Address,
) -> (
    rail_x402::wire::PaymentPayload,
    rail_x402::wire::PaymentRequirements,
) {
    let evm = ExactEvm::new(f.devnet.clone(), token(), pay_to);
    let required = evm.payment_required("http://shop.test/report", "a report", PRICE.into());
    let key = LocalSigner::random();
    f.devnet
        .mint(token().address, key.address(), U256::from(PRICE))
        .unwrap();
    let payer = X402Payer::new(
        key,
        Policy::new("eip155:84532", token().address, U256::from(PRICE)),
    );
    (payer.pay(&required).unwrap(), required.accepts[0].clone())
}

#[tokio::test]
async fn ed25519_and_p256_keys_are_accepted_by_pyjwt() {
    let Some(python) = python_with_pyjwt() else {
        return;
    };
    for (kind, one_line) in [
        ("ed25519", false),
        ("ec-sec1", false),
        ("ec-pkcs8", false),
        ("ec-sec1", true),
    ] {
        let key = keygen(&python, kind);
        let f = Facilitator::start(&python, KEY_ID, &key).await;
        // A PEM pasted into one line of an environment file, with literal `\n`.
        let secret = if one_line {
            key.secret.trim_end().replace('\n', "\\n")
        } else {
            key.secret.clone()
        };
        let auth = CdpAuth::new(KEY_ID, &secret).unwrap();
        assert_eq!(
            auth.algorithm(),
            if kind == "ed25519" { "EdDSA" } else { "ES256" }
        );
        let client = f.client(Some(Arc::new(auth)));

        let supported = client.supported().await.unwrap();
        assert_eq!(supported.kinds[0].network, "eip155:84532");
        let pay_to = Address::repeat_byte(0x22);
        let (payload, requirements) = payment(&f, pay_to);
        let verified = client.verify(&payload, &requirements).await.unwrap();
        assert!(verified.is_valid, "{kind}: {verified:?}");
        let settled = client.settle(&payload, &requirements).await.unwrap();
        assert!(settled.success, "{kind}: {settled:?}");
        assert_eq!(
            f.devnet.balance(token().address, pay_to).unwrap(),
            U256::from(PRICE)
        );

        // Each call was let in by PyJWT with a token naming it (and a nonce never seen
        // before: the verifier refuses a token presented twice).
        let host = f.host();
        assert_eq!(
            f.seen(),
            vec![
                (format!("GET {host}/supported"), Ok(())),
                (format!("POST {host}/verify"), Ok(())),
                (format!("POST {host}/settle"), Ok(())),
            ],
            "{kind} (one line: {one_line})"
        );
    }
}

#[tokio::test]
async fn missing_or_wrong_credentials_are_refused_in_one_sentence() {
    let Some(python) = python_with_pyjwt() else {
        return;
    };
    let key = keygen(&python, "ed25519");
    let f = Facilitator::start(&python, KEY_ID, &key).await;
    let pay_to = Address::repeat_byte(0x33);
    let (payload, requirements) = payment(&f, pay_to);
    let refused_with = |e: FacilitatorError, sentence: &str| {
        assert!(!e.is_retryable(), "{e}");
        assert!(matches!(e, FacilitatorError::Unauthorized(_)), "{e:?}");
        assert_eq!(e.to_string(), sentence);
    };

    // No credentials at all.
    let e = f.client(None).supported().await.unwrap_err();
    refused_with(
        e,
        &format!(
            "the facilitator at {} refused a request without credentials (401 Unauthorized): configure its credentials (facilitator_auth = \"cdp\" or \"bearer\")",
            f.url
        ),
    );

    // Credentials the facilitator does not accept: the one sentence, on every call.
    let ours = format!(
        "the facilitator at {} refused our credentials (401 Unauthorized): {HINT}",
        f.url
    );
    let other_key = keygen(&python, "ed25519");
    let other_ec = keygen(&python, "ec-sec1");
    let wrong: Vec<(&str, Arc<dyn FacilitatorAuth>)> = vec![
        (
            "another key",
            Arc::new(
                CdpAuth::new(KEY_ID, &other_key.secret)
                    .unwrap()
                    .with_hint(HINT),
            ),
        ),
        (
            "another algorithm",
            Arc::new(
                CdpAuth::new(KEY_ID, &other_ec.secret)
                    .unwrap()
                    .with_hint(HINT),
            ),
        ),
        (
            "another key id",
            Arc::new(
                CdpAuth::new("organizations/o/apiKeys/someone-else", &key.secret)
                    .unwrap()
                    .with_hint(HINT),
            ),
        ),
        (
            "a plain token",
            Arc::new(
                Bearer::new("not-a-jwt", "FACILITATOR_TOKEN")
                    .unwrap()
                    .with_hint(HINT),
            ),
        ),
    ];
    for (what, auth) in wrong {
        let client = f.client(Some(auth));
        refused_with(client.supported().await.unwrap_err(), &ours);
        refused_with(
            client.verify(&payload, &requirements).await.unwrap_err(),
            &ours,
        );
        refused_with(
            client.settle(&payload, &requirements).await.unwrap_err(),
            &ours,
        );
        let (_, last) = f.seen().pop().unwrap();
        let why = last.unwrap_err();
        let expected = match what {
            "another key" => "InvalidSignatureError",
            "another algorithm" => "alg 'ES256', expected EdDSA",
            "another key id" => "is not the key id",
            _ => "not a JWT",
        };
        assert!(why.contains(expected), "{what}: PyJWT said {why}");
    }
    // Nothing settled, and every request was refused.
    assert_eq!(
        f.devnet.balance(token().address, pay_to).unwrap(),
        U256::ZERO
    );
    assert!(f.seen().iter().all(|(_, v)| v.is_err()), "{:?}", f.seen());

    // The right key still gets in, after all those refusals.
    let client = f.client(Some(Arc::new(CdpAuth::new(KEY_ID, &key.secret).unwrap())));
    assert!(
        client
            .settle(&payload, &requirements)
            .await
            .unwrap()
            .success
    );
}
