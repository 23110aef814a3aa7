//! The x402 rail's facilitator credentials in the registry (`facilitator_auth`,
//! `cdp_key_id_env`, `cdp_key_secret_env`, `facilitator_token_env`): each refusal is one
//! sentence naming what to fix, and an accepted configuration sends its credentials — a CDP
//! JWT or a bearer token — to the facilitator (seen here through the readiness probe of
//! `stipendex::registry::dependencies_of_toml`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use base64::Engine as _;
use serde_json::json;
use stipendex::Registry;
use stipendex::registry::dependencies_of_toml;

/// A P-256 test key as the CDP portal hands it out (SEC1 PEM); never used for anything else.
const P256_PEM: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIMma2pbqtdzPuRhAu5vaGCGqcUQ9qb2cmjHb9W0UfWv7oAoGCCqGSM49
AwEHoUQDQgAEZELsJKjD6uZxeW2HvCRf3ynci3m+k2UVSWd81uYrqKUVcLEdh/1P
SMHtnGVV36xGm47laUX7+kq/3StBPTUA2Q==
-----END EC PRIVATE KEY-----
";
const KEY_ID: &str = "organizations/org-1/apiKeys/key-1";

/// A base64 Ed25519 secret (seed, then public key), as CDP issues them.
fn ed25519_secret() -> String {
    let key = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    let mut both = key.to_bytes().to_vec();
    both.extend_from_slice(key.verifying_key().as_bytes());
    base64::engine::general_purpose::STANDARD.encode(both)
}

/// A receiving x402 rail `base` with `extra` lines, its facilitator at `url` (none if `None`).
fn config(url: Option<&str>, extra: &str) -> String {
    let receiver = match url {
        Some(u) => format!(
            "pay_to = \"0x209693Bc6afc0C5328bA36FaF03C514EF312287C\"\nfacilitator_url = \"{u}\"\n"
        ),
        None => "payer_key_env = \"X402_PAYER_KEY\"\nmax_amount = \"1.00\"\nrpc_url = \"http://127.0.0.1:8545\"\n".into(),
    };
    format!(
        r#"[store]
url = "memory"

[rails.base]
kind = "x402"
network = "eip155:8453"
token = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
token_name = "USD Coin"
token_version = "2"
{receiver}{extra}"#
    )
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn refusal(text: &str, env: &BTreeMap<String, String>) -> String {
    let e = Registry::from_toml(text, env)
        .await
        .unwrap_err()
        .to_string();
    // The readiness probes read the configuration alike and refuse it the same way.
    assert_eq!(
        dependencies_of_toml(text, env).unwrap_err().to_string(),
        e,
        "{text}"
    );
    assert!(!e.contains('\n'), "one sentence: {e}");
    e
}

const URL: &str = "https://api.cdp.coinbase.com/platform/v2/x402";

#[tokio::test]
async fn facilitator_credentials_are_refused_in_one_sentence() {
    let cdp_env = env(&[
        ("CDP_API_KEY_ID", KEY_ID),
        ("CDP_API_KEY_SECRET", &ed25519_secret()),
    ]);

    // Credentials without a facilitator to give them to.
    let e = refusal(&config(None, "facilitator_auth = \"cdp\"\n"), &cdp_env).await;
    assert_eq!(
        e,
        "configuration: rails.base: facilitator_auth configures a facilitator's credentials, but there is no `facilitator_url`: add the facilitator's URL (and `pay_to`), or remove it"
    );
    let e = refusal(
        &config(
            None,
            "facilitator_auth = \"bearer\"\nfacilitator_token_env = \"TOKEN\"\n",
        ),
        &cdp_env,
    )
    .await;
    assert!(
        e.ends_with("facilitator_auth, facilitator_token_env configure a facilitator's credentials, but there is no `facilitator_url`: add the facilitator's URL (and `pay_to`), or remove them"),
        "{e}"
    );

    // The named variables: missing, then unusable.
    let cdp = "facilitator_auth = \"cdp\"\n";
    let e = refusal(&config(Some(URL), cdp), &env(&[])).await;
    assert_eq!(
        e,
        "rail `base` needs the environment variable CDP_API_KEY_ID, which is not set"
    );
    let e = refusal(&config(Some(URL), cdp), &env(&[("CDP_API_KEY_ID", KEY_ID)])).await;
    assert_eq!(
        e,
        "rail `base` needs the environment variable CDP_API_KEY_SECRET, which is not set"
    );
    let e = refusal(
        &config(Some(URL), cdp),
        &env(&[
            ("CDP_API_KEY_ID", KEY_ID),
            ("CDP_API_KEY_SECRET", "hunter2-not-a-key"),
        ]),
    )
    .await;
    assert_eq!(
        e,
        "rail `base`: CDP_API_KEY_SECRET is neither a base64 Ed25519 key nor a PEM EC P-256 key"
    );
    assert!(!e.contains("hunter2"), "the secret is never repeated");
    // Variables of one's own naming are the ones named.
    let own = "facilitator_auth = \"cdp\"\ncdp_key_id_env = \"SHOP_CDP_ID\"\ncdp_key_secret_env = \"SHOP_CDP_SECRET\"\n";
    let e = refusal(
        &config(Some(URL), own),
        &env(&[("SHOP_CDP_ID", KEY_ID), ("SHOP_CDP_SECRET", "AAAA")]),
    )
    .await;
    assert_eq!(
        e,
        "rail `base`: SHOP_CDP_SECRET is neither a base64 Ed25519 key nor a PEM EC P-256 key"
    );

    // A bearer token: its variable must be named, set, and hold one line.
    let e = refusal(
        &config(Some(URL), "facilitator_auth = \"bearer\"\n"),
        &env(&[]),
    )
    .await;
    assert_eq!(
        e,
        "configuration: rails.base: facilitator_auth = \"bearer\" needs `facilitator_token_env`, the environment variable that holds the token"
    );
    let bearer = "facilitator_auth = \"bearer\"\nfacilitator_token_env = \"FACILITATOR_TOKEN\"\n";
    let e = refusal(&config(Some(URL), bearer), &env(&[])).await;
    assert_eq!(
        e,
        "rail `base` needs the environment variable FACILITATOR_TOKEN, which is not set"
    );
    let e = refusal(
        &config(Some(URL), bearer),
        &env(&[("FACILITATOR_TOKEN", "one\ntwo")]),
    )
    .await;
    assert_eq!(
        e,
        "rail `base`: FACILITATOR_TOKEN holds characters a header cannot carry: give the token alone, on one line"
    );

    // Keys that do not go together, and an unknown kind of credentials.
    let e = refusal(
        &config(
            Some(URL),
            "facilitator_auth = \"bearer\"\nfacilitator_token_env = \"T\"\ncdp_key_id_env = \"ID\"\n",
        ),
        &env(&[("T", "tok")]),
    )
    .await;
    assert_eq!(
        e,
        "configuration: rails.base.cdp_key_id_env applies to facilitator_auth = \"cdp\" only: remove it, or set facilitator_auth = \"cdp\""
    );
    let e = refusal(&config(Some(URL), "cdp_key_secret_env = \"S\"\n"), &cdp_env).await;
    assert_eq!(
        e,
        "configuration: rails.base: cdp_key_secret_env needs facilitator_auth = \"cdp\" or \"bearer\""
    );
    let e = refusal(
        &config(Some(URL), "facilitator_auth = \"oauth\"\n"),
        &cdp_env,
    )
    .await;
    assert_eq!(
        e,
        "configuration: rails.base.facilitator_auth: \"oauth\" is not one of \"cdp\" (a Coinbase Developer Platform API key) or \"bearer\" (a fixed token)"
    );
}

/// A facilitator answering `GET /supported` with `status`, recording each `Authorization`.
async fn facilitator(status: StatusCode) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let app = Router::new().route(
        "/supported",
        get(move |h: HeaderMap| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(
                    h.get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default(),
                );
                (
                    status,
                    axum::Json(json!({"kinds": [{"x402Version": 2, "scheme": "exact", "network": "eip155:8453"}], "extensions": [], "signers": {}})),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test]
async fn accepted_credentials_reach_the_facilitator() {
    let (url, seen) = facilitator(StatusCode::OK).await;
    let cases = [
        (
            "facilitator_auth = \"cdp\"\n",
            env(&[
                ("CDP_API_KEY_ID", KEY_ID),
                ("CDP_API_KEY_SECRET", &ed25519_secret()),
            ]),
            "EdDSA",
        ),
        (
            // A PEM on one line of an environment file, with literal `\n`.
            "facilitator_auth = \"cdp\"\ncdp_key_id_env = \"SHOP_CDP_ID\"\ncdp_key_secret_env = \"SHOP_CDP_SECRET\"\n",
            env(&[
                ("SHOP_CDP_ID", KEY_ID),
                ("SHOP_CDP_SECRET", &P256_PEM.replace('\n', "\\n")),
            ]),
            "ES256",
        ),
        (
            "facilitator_auth = \"bearer\"\nfacilitator_token_env = \"FACILITATOR_TOKEN\"\n",
            env(&[("FACILITATOR_TOKEN", "tok-123")]),
            "bearer",
        ),
    ];
    for (extra, env, alg) in cases {
        let text = config(Some(&url), extra);
        let registry = Registry::from_toml(&text, &env).await.unwrap();
        assert!(registry.receiver("base").is_ok());
        let deps = dependencies_of_toml(&text, &env).unwrap();
        assert_eq!(deps.len(), 1);
        assert_eq!(deps[0].name(), format!("facilitator {url}"));
        deps[0].check().await.unwrap();
        let sent = seen.lock().unwrap().pop().unwrap();
        if alg == "bearer" {
            assert_eq!(sent, "Bearer tok-123");
        } else {
            let jwt = sent.strip_prefix("Bearer ").unwrap();
            let header: serde_json::Value = serde_json::from_slice(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(jwt.split('.').next().unwrap())
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(header["alg"], alg);
            assert_eq!(header["kid"], KEY_ID);
        }
    }
    // Without credentials, a receiving rail's facilitator is probed all the same.
    let text = config(Some(&url), "");
    let deps = dependencies_of_toml(&text, &env(&[])).unwrap();
    deps[0].check().await.unwrap();
    assert_eq!(seen.lock().unwrap().pop().unwrap(), "");
}

#[tokio::test]
async fn refused_credentials_name_the_keys_to_check() {
    let (url, _) = facilitator(StatusCode::UNAUTHORIZED).await;
    let text = config(
        Some(&url),
        "facilitator_auth = \"cdp\"\ncdp_key_id_env = \"SHOP_CDP_ID\"\ncdp_key_secret_env = \"SHOP_CDP_SECRET\"\n",
    );
    let env = env(&[
        ("SHOP_CDP_ID", KEY_ID),
        ("SHOP_CDP_SECRET", &ed25519_secret()),
    ]);
    let deps = dependencies_of_toml(&text, &env).unwrap();
    assert_eq!(
        deps[0].check().await.unwrap_err(),
        format!(
            "the facilitator at {url} refused our credentials (401 Unauthorized): check the API key named by cdp_key_id_env/cdp_key_secret_env (SHOP_CDP_ID/SHOP_CDP_SECRET)"
        )
    );
}
