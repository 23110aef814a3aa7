//! The registry against real rails in process: an algod-compatible devnet (exact-algo) and the
//! Stripe emulator, both over HTTP; and the configuration's refusals.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeMap;
use std::time::Duration;

use algod_devnet::{Devnet, DevnetConfig};
use ed25519_dalek::SigningKey;
use rail_exact_algo::Address;
use stipendex::{Asset, Charge, Error, Money, Offer, OpId, PaymentMode, Registry};
use stripe_emulator::{Emulator, EmulatorConfig};

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn exact_algo_and_stripe_from_one_file() {
    let payer_seed = [7u8; 32];
    let payer_key = SigningKey::from_bytes(&payer_seed);
    let treasury = Address(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes());
    let algod = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (Address(payer_key.verifying_key().to_bytes()), 5_000_000),
                (treasury, 100_000),
            ],
            ..DevnetConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let stripe = Emulator::spawn(EmulatorConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        r#"
        [store]
        url = "memory"

        [rails.algo]
        kind = "exact-algo"
        algod_url = "{algod}"
        payer_key_env = "ALGO_KEY"
        max_amount = "0.5"
        pay_to = "{treasury}"

        [rails.card]
        kind = "stripe"
        api_base = "{stripe}"
        payment_method = "pm_card_visa"
        max_amount = "20.00"
        secret_key_env = "STRIPE_KEY"
        publishable_key = "pk_test_emulator"
        payee = "shop-1"
        "#,
        algod = algod.url,
        stripe = stripe.url,
    );
    let env = env(&[
        ("ALGO_KEY", &hex::encode(payer_seed)),
        ("STRIPE_KEY", "sk_test_emulator"),
    ]);
    let registry = Registry::from_toml(&config, &env).await.unwrap();
    let names: Vec<_> = registry
        .rails()
        .map(|e| (e.name.as_str(), e.kind))
        .collect();
    assert_eq!(names, [("algo", "exact-algo"), ("card", "stripe")]);
    assert!(!registry.get("algo").unwrap().capabilities().unwrap().hold);
    assert!(registry.get("card").unwrap().capabilities().unwrap().hold);

    // An ALGO offer is payable by the exact-algo rail only, and is paid through it.
    let algo = registry.handle("algo").unwrap();
    let offer = algo
        .receiver
        .offer(&Charge::capture(
            Money::parse(Asset::algo(), "0.001").unwrap(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(registry.can_pay(&offer), ["algo"]);
    let payment = algo.payer.pay(&OpId::random(), &offer).await.unwrap();
    let verified = algo.receiver.verify(&offer, &payment).await.unwrap();
    assert_eq!(verified.amount, offer.amount);
    assert_eq!(algod.devnet.balance(&treasury), 101_000);

    // Above the payer's configured limit: no rail can pay it.
    let dear = algo
        .receiver
        .offer(&Charge::capture(
            Money::parse(Asset::algo(), "0.6").unwrap(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert!(registry.can_pay(&dear).is_empty());

    // A USD hold is payable by the Stripe rail (it holds); captured in part.
    let card = registry.handle("card").unwrap();
    let offer = card
        .receiver
        .offer(&Charge {
            mode: PaymentMode::Hold,
            ..Charge::capture(
                Money::parse(Asset::usd(), "5.00").unwrap(),
                Duration::from_secs(600),
            )
        })
        .await
        .unwrap();
    assert_eq!(registry.can_pay(&offer), ["card"]);
    let (hold_payer, hold_receiver) = card.holds().unwrap();
    let held = hold_payer.hold(&OpId::random(), &offer).await.unwrap();
    let verified = card.receiver.verify(&offer, &held).await.unwrap();
    let captured = hold_receiver
        .capture(
            &OpId::random(),
            &verified,
            &Money::parse(Asset::usd(), "3.25").unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        captured.captured,
        Money::parse(Asset::usd(), "3.25").unwrap()
    );
    assert_eq!(
        captured.released,
        Money::parse(Asset::usd(), "1.75").unwrap()
    );
}

/// Testnet's genesis hash (`SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=`): the in-process
/// devnet below answers as testnet, so the network's real spellings apply.
const TESTNET_GENESIS: [u8; 32] = [
    72, 99, 181, 24, 164, 179, 200, 78, 200, 16, 242, 45, 79, 16, 129, 203, 15, 113, 240, 89, 167,
    172, 32, 222, 198, 47, 127, 112, 229, 9, 58, 34,
];

/// A registry with one exact-algo rail on `algod` (both sides) whose payer's policy names
/// `networks` (a TOML array).
async fn algo_rail(algod: &str, networks: &str) -> Result<Registry, Error> {
    let treasury = Address(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes());
    let config = format!(
        r#"
        [store]
        url = "memory"

        [rails.algo]
        kind = "exact-algo"
        algod_url = "{algod}"
        payer_key_env = "ALGO_KEY"
        max_amount = "0.5"
        networks = {networks}
        pay_to = "{treasury}"
        "#
    );
    Registry::from_toml(&config, &env(&[("ALGO_KEY", &hex::encode([7u8; 32]))])).await
}

#[tokio::test]
async fn an_exact_algo_offer_is_payable_whichever_way_its_network_is_spelled() {
    const TESTNET: &str = "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe";
    const TESTNET_WHOLE: &str = "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=";
    const TESTNET_URL: &str = "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9_cOUJOiI";
    const MAINNET: &str = "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73k";
    const MAINNET_WHOLE: &str = "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=";
    let payer = SigningKey::from_bytes(&[7; 32]);
    let treasury = Address(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes());
    let algod = Devnet::spawn(
        DevnetConfig {
            genesis_id: "testnet-v1.0".into(),
            genesis_hash: TESTNET_GENESIS,
            accounts: vec![
                (Address(payer.verifying_key().to_bytes()), 5_000_000),
                (treasury, 100_000),
            ],
            ..DevnetConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(algod.devnet.network(), TESTNET);
    let charge = Charge::capture(
        Money::parse(Asset::algo(), "0.001").unwrap(),
        Duration::from_secs(60),
    );
    let spelled = |offer: &Offer, network: &str| {
        let mut o = offer.clone();
        o.details["network"] = network.into();
        o
    };
    // The policy in either spelling; the offer in any.
    for policy in [TESTNET, TESTNET_WHOLE] {
        let registry = algo_rail(&algod.url, &format!("[{policy:?}]"))
            .await
            .unwrap();
        let offer = registry
            .handle("algo")
            .unwrap()
            .receiver
            .offer(&charge)
            .await
            .unwrap();
        assert_eq!(offer.details["network"], TESTNET);
        for network in [TESTNET, TESTNET_WHOLE, TESTNET_URL] {
            assert_eq!(
                registry.can_pay(&spelled(&offer, network)),
                ["algo"],
                "policy {policy}, offer {network}"
            );
        }
        // Another chain, however spelled, or not an Algorand network at all: no.
        for network in [MAINNET, MAINNET_WHOLE, "eip155:1"] {
            assert!(
                registry.can_pay(&spelled(&offer, network)).is_empty(),
                "policy {policy}, offer {network}"
            );
        }
    }
    // No networks named: any Algorand network (algod's is checked when paying), never another
    // namespace.
    let registry = algo_rail(&algod.url, "[]").await.unwrap();
    let algo = registry.handle("algo").unwrap();
    let offer = algo.receiver.offer(&charge).await.unwrap();
    assert_eq!(registry.can_pay(&spelled(&offer, MAINNET_WHOLE)), ["algo"]);
    assert!(registry.can_pay(&spelled(&offer, "eip155:1")).is_empty());
    // An offer spelled with the whole hash is paid and verified as it is.
    let whole = spelled(&offer, TESTNET_WHOLE);
    assert_eq!(registry.can_pay(&whole), ["algo"]);
    let payment = algo.payer.pay(&OpId::random(), &whole).await.unwrap();
    let verified = algo.receiver.verify(&whole, &payment).await.unwrap();
    assert_eq!(verified.amount, offer.amount);
    assert_eq!(algod.devnet.balance(&treasury), 101_000);
    // A configured network that is not an Algorand one is a configuration mistake.
    let msg = algo_rail(&algod.url, r#"["algorand:testnet"]"#)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("rails.algo.networks: \"algorand:testnet\" is not an Algorand network"),
        "{msg}"
    );
}

async fn refusal(config: &str, env: &BTreeMap<String, String>) -> String {
    Registry::from_toml(config, env)
        .await
        .unwrap_err()
        .to_string()
}

#[tokio::test]
async fn secrets_come_from_the_environment_only() {
    let msg = refusal(
        r#"
        [store]
        url = "memory"
        [rails.base]
        kind = "x402"
        network = "eip155:84532"
        token = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
        token_name = "USDC"
        token_version = "2"
        payer_key = "0x0101010101010101010101010101010101010101010101010101010101010101"
        "#,
        &BTreeMap::new(),
    )
    .await;
    assert_eq!(
        msg,
        "configuration: rails.base.payer_key: secrets are read from the environment only; write `payer_key_env = \"VARIABLE\"` instead"
    );
}

#[tokio::test]
async fn a_missing_or_bad_secret_is_named_and_never_echoed() {
    let config = r#"
        [store]
        url = "memory"
        [rails.base]
        kind = "x402"
        network = "eip155:84532"
        token = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
        token_name = "USDC"
        token_version = "2"
        payer_key_env = "X402_PAYER_KEY"
        max_amount = "1.00"
        rpc_url = "http://127.0.0.1:9"
        "#;
    assert_eq!(
        refusal(config, &BTreeMap::new()).await,
        "rail `base` needs the environment variable X402_PAYER_KEY, which is not set"
    );
    let msg = refusal(config, &env(&[("X402_PAYER_KEY", "not-a-key-s3cr3t")])).await;
    assert!(
        msg.starts_with("rail `base`: X402_PAYER_KEY is unusable"),
        "{msg}"
    );
    assert!(!msg.contains("s3cr3t"), "{msg}");
}

#[tokio::test]
async fn configuration_mistakes_are_named() {
    let none = BTreeMap::new();
    // A payer keeps single-use records (paid operations): without a [store] it is refused.
    let key = env(&[("K", &"11".repeat(32))]);
    assert_eq!(
        refusal(
            "[rails.a]\nkind = \"account\"\nurl = \"http://127.0.0.1:9\"\nnetwork = \"n\"\npayer_account = \"0000000000000000000000000000a11c\"\npayer_key_env = \"K\"\n",
            &key
        )
        .await,
        "configuration: rails.a: this rail keeps single-use records: add a [store] (url = \"sqlite://stipendex.db\", a postgres:// URL, or \"memory\" for tests)"
    );
    assert_eq!(
        refusal(
            "[store]\nurl = \"memory\"\n[rails.a]\nkind = \"paypal\"\n",
            &none
        )
        .await,
        "rail `a` has an unknown kind `paypal`: use one of ledger, account, x402, exact-algo, exact-avm, stripe, ln-nwc"
    );
    let msg = refusal(
        "[store]\nurl = \"memory\"\n[rails.a]\nkind = \"ledger\"\nurl = \"sqlite://x.db\"\npayer_acount = \"1\"\n",
        &none,
    )
    .await;
    assert!(
        msg.contains("rails.a: unknown field `payer_acount`"),
        "{msg}"
    );
    let msg = refusal(
        "[store]\nurl = \"memory\"\n[rails.a]\nkind = \"stripe\"\nmax_amount = \"1.005\"\npayment_method = \"pm_card_visa\"\n",
        &none,
    )
    .await;
    assert!(
        msg.contains("rails.a.max_amount: \"1.005\" is not an amount of USD"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_unknown_rail_name_or_side_is_an_error() {
    let r = Registry::from_toml("[store]\nurl = \"memory\"\n", &BTreeMap::new())
        .await
        .unwrap();
    assert!(matches!(r.payer("nope"), Err(Error::NoSuchRail(_))));
}

#[tokio::test]
async fn an_account_rail_at_a_hosted_facilitator() {
    use rail_account::AccountKey;
    use stipendex_facilitator::{Config, NewAccount};
    let dir = tempfile::tempdir().unwrap();
    let fac = stipendex_facilitator::open(
        &format!("sqlite://{}/fac.db", dir.path().display()),
        None,
        Config::new("fac.test"),
        None,
    )
    .await
    .unwrap();
    let (agent, shop) = ([3u8; 32], [4u8; 32]);
    let (agent_id, shop_id) = (
        "0000000000000000000000000000a11c",
        "00000000000000000000000000000b0b",
    );
    for (id, seed) in [(agent_id, agent), (shop_id, shop)] {
        fac.create_account(NewAccount {
            id: Some(id.parse().unwrap()),
            key: AccountKey::from_seed(&seed).public(),
            asset: Asset::usd(),
            review_above: None,
            label: id.into(),
        })
        .await
        .unwrap();
    }
    fac.fund(
        agent_id.parse().unwrap(),
        &Money::parse(Asset::usd(), "10.00").unwrap(),
        "t",
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(stipendex_facilitator::serve(
        listener,
        fac.clone(),
        std::future::pending(),
    ));
    let config = format!(
        r#"
        [store]
        url = "memory"

        [rails.hosted]
        kind = "account"
        url = "{url}"
        network = "fac.test"
        payer_account = "{agent_id}"
        payer_key_env = "AGENT_KEY"
        payee_account = "{shop_id}"
        payee_key_env = "SHOP_KEY"
        "#
    );
    let env = env(&[
        ("AGENT_KEY", &hex::encode(agent)),
        ("SHOP_KEY", &hex::encode(shop)),
    ]);
    let registry = Registry::from_toml(&config, &env).await.unwrap();
    let rail = registry.handle("hosted").unwrap();
    let offer = rail
        .receiver
        .offer(&Charge::capture(
            Money::parse(Asset::usd(), "0.25").unwrap(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(registry.can_pay(&offer), vec!["hosted"]);
    let payment = rail.payer.pay(&OpId::random(), &offer).await.unwrap();
    let verified = rail.receiver.verify(&offer, &payment).await.unwrap();
    assert_eq!(verified.amount.minor_units(), 25);
    // A receiver that verifies at the facilitator needs no [store].
    let receiver_only = format!(
        "[rails.hosted]\nkind = \"account\"\nurl = \"{url}\"\nnetwork = \"fac.test\"\npayee_account = \"{shop_id}\"\npayee_key_env = \"SHOP_KEY\"\n"
    );
    Registry::from_toml(&receiver_only, &env).await.unwrap();
    // A side without its key is named.
    let half = config.replace("payee_key_env = \"SHOP_KEY\"", "");
    let e = Registry::from_toml(&half, &env)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`payee_account` and `payee_key_env` go together"),
        "{e}"
    );
    server.abort();
}

/// A wallet built from a registry (`Wallet::builder(..).registry(..)`) also pays the unsigned
/// x402 challenges of its x402-style rails: the exact-algo rail's scheme payer signs an
/// exact-algo 402 under the mandate (what `stipendex fetch` relies on).
#[tokio::test]
async fn a_registry_wallet_pays_an_exact_algo_402_with_the_rails_scheme_payer() {
    use axum::routing::get;
    use rail_core::{MemoryKeyStore, SystemClock};
    use rail_exact_algo::{AlgodClient, ExactAlgo, ExactAlgoReceiver};
    use std::sync::Arc;
    use stipendex::envelope::{Allow, SecretKey};
    use x402_transport::{Accepts, paywall::Paywall};

    let payer_seed = [7u8; 32];
    let payer_key = SigningKey::from_bytes(&payer_seed);
    let treasury = Address(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes());
    let algod = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (Address(payer_key.verifying_key().to_bytes()), 5_000_000),
                (treasury, 100_000),
            ],
            ..DevnetConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    // The server: an exact-algo paywall paying the treasury.
    let receiver = ExactAlgoReceiver::connect(
        AlgodClient::new(&algod.url, None).unwrap(),
        treasury,
        Arc::new(MemoryKeyStore::default()),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let scheme: Arc<dyn x402_transport::Scheme> = Arc::new(ExactAlgo::new(receiver.clone()));
    let app = Paywall::new()
        .with_served(receiver.served().clone())
        .route(
            "/weather",
            "the weather",
            Accepts::one(scheme, 2_000).unwrap(),
        )
        .apply(axum::Router::new().route("/weather", get(|| async { "sunny" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // The wallet: its rails from a registry (the exact-algo payer only), its mandate allowing
    // the server's origin and treasury.
    let config = format!(
        r#"
        [store]
        url = "memory"

        [rails.algo]
        kind = "exact-algo"
        algod_url = "{}"
        payer_key_env = "ALGO_KEY"
        max_amount = "0.5"
        "#,
        algod.url
    );
    let registry = Registry::from_toml(&config, &env(&[("ALGO_KEY", &hex::encode(payer_seed))]))
        .await
        .unwrap();
    assert!(registry.get("algo").unwrap().scheme_payer.is_some());
    let (principal, wallet_key) = (SecretKey::generate(), SecretKey::generate());
    let m = stipendex_test_kit::mandate(&principal, wallet_key.public())
        .from(stipendex_test_kit::now() - 60)
        .limits(stipendex_test_kit::limits(Asset::algo(), "0.01", "1"))
        .allow(Allow::X402Http {
            origin: base.clone(),
            pay_to: treasury.to_string(),
        })
        .sign();
    let wallet = stipendex::wallet::Wallet::builder(wallet_key, m)
        .registry(&registry)
        .build()
        .unwrap();
    let client = stipendex::http::Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(10)),
        wallet,
    )
    .unwrap();
    let r = client.get(&format!("{base}/weather")).await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"sunny"[..]));
    let paid = r.x402.expect("an x402 payment");
    assert_eq!(paid.payer, "exact-algo");
    assert_eq!(algod.devnet.balance(&treasury), 102_000);
}

/// `kind = "exact-avm"`: USDC on the devnet posing as testnet, this process the facilitator
/// paying the fees; an offer in USDC is paid and settled through the configured rail.
#[tokio::test]
async fn exact_avm_from_the_file_pays_usdc_with_sponsored_fees() {
    use algod_devnet::TESTNET_USDC;
    let (payer_seed, fee_seed) = ([0x21u8; 32], [0x22u8; 32]);
    let addr = |seed: [u8; 32]| Address(SigningKey::from_bytes(&seed).verifying_key().to_bytes());
    let (issuer, treasury) = (addr([0x23; 32]), addr([0x24; 32]));
    let algod = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (issuer, 1_000_000),
                (addr(payer_seed), 1_000_000),
                (addr(fee_seed), 1_000_000),
                (treasury, 1_000_000),
            ],
            ..DevnetConfig::testnet(issuer)
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let d = &algod.devnet;
    d.opt_in(addr(payer_seed), TESTNET_USDC).unwrap();
    d.fund_asset(addr(payer_seed), TESTNET_USDC, 5_000_000)
        .unwrap();
    d.opt_in(treasury, TESTNET_USDC).unwrap();
    let config = format!(
        r#"
        [store]
        url = "memory"

        [rails.usdc]
        kind = "exact-avm"
        algod_url = "{algod}"
        payer_key_env = "AVM_PAYER_KEY"
        max_amount = "1.00"
        pay_to = "{treasury}"
        fee_payer_key_env = "AVM_FEE_PAYER_KEY"
        "#,
        algod = algod.url,
    );
    let env = env(&[
        ("AVM_PAYER_KEY", &hex::encode(payer_seed)),
        ("AVM_FEE_PAYER_KEY", &hex::encode(fee_seed)),
    ]);
    let registry = Registry::from_toml(&config, &env).await.unwrap();
    let usdc = registry.handle("usdc").unwrap();
    let offer = usdc
        .receiver
        .offer(&Charge::capture(
            Money::parse(Asset::usdc(), "0.01").unwrap(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(registry.can_pay(&offer), ["usdc"]);
    let payment = usdc.payer.pay(&OpId::random(), &offer).await.unwrap();
    let verified = usdc.receiver.verify(&offer, &payment).await.unwrap();
    assert_eq!(verified.amount, offer.amount);
    assert_eq!(d.asset_balance(&treasury, TESTNET_USDC), Some(10_000));
    assert_eq!(
        d.balance(&addr(payer_seed)),
        1_000_000,
        "the fees were sponsored"
    );
    // Above the payer's limit: no rail pays it.
    let dear = usdc
        .receiver
        .offer(&Charge::capture(
            Money::parse(Asset::usdc(), "1.01").unwrap(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert!(registry.can_pay(&dear).is_empty());
    // Two facilitators named at once are refused, in one sentence.
    let both = config.replace(
        "fee_payer_key_env = \"AVM_FEE_PAYER_KEY\"",
        "fee_payer_key_env = \"AVM_FEE_PAYER_KEY\"\n        facilitator_url = \"http://127.0.0.1:9\"",
    );
    let Err(e) = Registry::from_toml(&both, &env).await else {
        panic!("two facilitators were accepted")
    };
    assert!(e.to_string().contains("two facilitators"), "{e}");
}

/// Issue 46: the unknown-kind refusal lists the kinds this build really carries (these tests
/// build every rail), from `compiled_kinds`.
#[tokio::test]
async fn an_unknown_kind_lists_the_kinds_this_build_carries() {
    let kinds = stipendex::registry::compiled_kinds();
    assert_eq!(
        kinds,
        [
            "ledger",
            "account",
            "x402",
            "exact-algo",
            "exact-avm",
            "stripe",
            "ln-nwc"
        ]
    );
    for kind in &kinds {
        assert!(stipendex::registry::compiled(kind), "{kind}");
    }
    let msg = refusal(
        "[store]\nurl = \"memory\"\n[rails.a]\nkind = \"exact-evm\"\n",
        &BTreeMap::new(),
    )
    .await;
    assert!(
        msg.ends_with(&format!("use one of {}", kinds.join(", "))),
        "{msg}"
    );
}

/// Issue 46: a configuration that is not TOML, or whose field has the wrong type, is refused
/// in one line naming the file, the line and the column (no snippet over several lines, no
/// escaped new line).
#[tokio::test]
async fn a_toml_mistake_is_one_line_with_the_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rails.toml");
    let refused = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let path = path.clone();
        async move { Registry::from_file(&path).await.unwrap_err().to_string() }
    };
    let file = path.display().to_string();

    let msg =
        refused("[store]\nurl = \"memory\"\n\n[rails.a]\nkind = \"ledger\"\n[store]\nurl = 5\n")
            .await;
    assert_eq!(
        msg,
        format!("configuration: {file} line 6, column 2: duplicate key")
    );
    let msg = refused("# the store\n[store]\nurl = 5\n").await;
    assert_eq!(
        msg,
        format!(
            "configuration: {file} line 3, column 7: invalid type: integer `5`, expected a string"
        )
    );
    let msg = refused("[store]\nurl = memory\n").await;
    assert!(
        msg.starts_with(&format!("configuration: {file} line 2, column 7: ")),
        "{msg}"
    );
    assert!(msg.contains("string values must be quoted"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(!msg.contains("\\u{a}"), "{msg}");
    let msg = refused("[stor]\nurl = \"memory\"\n").await;
    assert!(
        msg.starts_with(&format!(
            "configuration: {file} line 1, column 2: unknown field `stor`"
        )),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    // From text (no file): the line and column alone.
    let msg = refusal("[store]\nurl = 5\n", &BTreeMap::new()).await;
    assert_eq!(
        msg,
        "configuration: line 2, column 7: invalid type: integer `5`, expected a string"
    );
}

/// Issue 46: a pricing file's mistake names the entry by its position and the line of its
/// `[[price]]`; a document that is not TOML, the file, line and column.
#[test]
fn a_price_file_mistake_names_the_entry_and_its_line() {
    use stipendex::receiver::price_file;
    let text = "[store]\nurl = \"memory\"\n\n[[price]]\nkind = \"tool\"\npattern = \"a\"\namount = \"0.01\"\nasset = \"USD\"\n\n[[price]]\nkind = \"tool\"\npattern = \"b\"\namount = \"1\"\nasset = \"EUR\"\n";
    let msg = price_file::from_toml(text).unwrap_err().to_string();
    assert!(
        msg.starts_with("configuration: [[price]] entry 2 (line 10): unknown asset \"EUR\""),
        "{msg}"
    );
    let unknown = text.replace("asset = \"EUR\"", "asset = \"USD\"\nprice = 3");
    let msg = price_file::from_toml(&unknown).unwrap_err().to_string();
    assert!(
        msg.starts_with("configuration: [[price]] entry 2 (line 10): unknown field `price`"),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    let path = std::path::Path::new("shop.toml");
    let msg = price_file::from_toml_at(path, &unknown)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("configuration: shop.toml: [[price]] entry 2 (line 10): "),
        "{msg}"
    );
    let broken = text.replace("amount = \"1\"", "amount = one");
    let msg = price_file::from_toml_at(path, &broken)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with(
            "configuration: shop.toml line 13, column 10: string values must be quoted"
        ),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(!msg.contains("\\u{a}"), "{msg}");
}
