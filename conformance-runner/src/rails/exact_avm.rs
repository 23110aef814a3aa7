//! The exact-avm rail's harness: x402's own `exact` on Algorand, paid in USDC.
//!
//! - **mock**: the algod-compatible devnet in process posing as Algorand testnet (its genesis
//!   and USDC as ASA 10458941), records in memory.
//! - **localnet**: the algod at `ALGOD_URL` (`algod-devnet` from `conformance localnet up`, whose
//!   faucet `ALGOD_FAUCET_SEED` holds the supply of `ALGOD_USDC_ASSET`): each harness funds its
//!   accounts with ALGO, opts them in with their own signed transfers and sends the payer its
//!   USDC; settlement and served-once records in PostgreSQL, shared by two receiver instances.
//!
//! The facilitator pays the fees (`extra.feePayer`), so the balances the suite checks are the
//! payer's and the payee's USDC, untouched by fees. The rail's own cases
//! ([`Harness::rail_checks`], in `checks`) are the scheme's rules, each with a group an
//! attacker built and signed itself, and the chain's verdicts.

use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::{Devnet, DevnetConfig, RunningDevnet, TESTNET_USDC};
use async_trait::async_trait;
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use futures::future::BoxFuture;
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, KeyStore, ManualClock, MemoryKeyStore, Payment, RailError, RailHandle, RailReason,
    RailResult, SharedClock,
};
use rail_exact_algo::avm::{AvmFacilitator, AvmPayer, AvmPolicy, AvmReceiver, ExactAvm, FeePayer};
use rail_exact_algo::txn::{AxferTxn, PayTxn, SignedTxn, Transaction};
use rail_exact_algo::{Address, AlgodClient};
use serde_json::json;
use x402_transport::served::ServedOnce;

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// exact-avm in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "exact-avm",
    tiers: &[
        (
            Tier::Mock,
            "algod-compatible devnet in process posing as testnet (USDC ASA 10458941), records in memory",
        ),
        (
            Tier::Localnet,
            "algod at ALGOD_URL (algod-devnet) with USDC ALGOD_USDC_ASSET from ALGOD_FAUCET_SEED, records in PostgreSQL shared by two receivers",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = ExactAvmHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// USDC base units the payer starts with (10 USDC).
const FUNDED: u64 = 10_000_000;
/// µALGO each account starts with (its minimum balance with one holding, and fees).
const ALGO: u64 = 1_000_000;

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

fn random_key() -> SigningKey {
    SigningKey::from_bytes(&rand::random::<[u8; 32]>())
}

/// A payer, a payee, another payee and a fee payer on an algod with USDC.
pub struct ExactAvmHarness {
    handle: RailHandle,
    twin: RailHandle,
    clock: ManualClock,
    algod: AlgodClient,
    /// The algod's URL and token, for the devnet's own controls (advance, freeze).
    algod_url: String,
    algod_token: Option<String>,
    asset: u64,
    scheme: ExactAvm,
    facilitator: AvmFacilitator,
    /// The twin receiver's facilitator (its own store handle on the same records).
    twin_facilitator: AvmFacilitator,
    payer_key: SigningKey,
    payee: Address,
    other: Address,
    fee_payer: Address,
    _devnet: Option<RunningDevnet>,
    pg: Option<super::pg::Schema>,
}

/// Signs and submits one transaction, waiting for it.
async fn send(algod: &AlgodClient, key: &SigningKey, t: Transaction) -> Result<(), HarnessError> {
    let s = SignedTxn::sign(t, key, None);
    let lv = s.txn.header().last_valid;
    let txid = algod.submit(&s.encode()).await.map_err(setup)?;
    algod
        .wait_for_confirmation(&txid, lv)
        .await
        .map_err(setup)?;
    Ok(())
}

async fn pay(
    algod: &AlgodClient,
    from: &SigningKey,
    to: Address,
    amount: u64,
) -> Result<(), HarnessError> {
    let p = algod.params().await.map_err(setup)?;
    send(
        algod,
        from,
        Transaction::Pay(PayTxn {
            sender: addr(from),
            receiver: to,
            amount,
            fee: p.min_fee.max(1000),
            first_valid: p.last_round.max(1),
            last_valid: p.last_round.max(1) + 1000,
            genesis_id: p.genesis_id,
            genesis_hash: p.genesis_hash,
            note: b"stipendex conformance funding".to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        }),
    )
    .await
}

async fn transfer(
    algod: &AlgodClient,
    from: &SigningKey,
    to: Address,
    asset: u64,
    amount: u64,
) -> Result<(), HarnessError> {
    let p = algod.params().await.map_err(setup)?;
    send(
        algod,
        from,
        Transaction::Axfer(AxferTxn {
            sender: addr(from),
            asset,
            amount,
            receiver: to,
            asset_sender: None,
            close_to: None,
            fee: p.min_fee.max(1000),
            first_valid: p.last_round.max(1),
            last_valid: p.last_round.max(1) + 1000,
            genesis_id: p.genesis_id,
            genesis_hash: p.genesis_hash,
            note: b"stipendex conformance".to_vec(),
            rekey_to: None,
            group: None,
            lease: None,
        }),
    )
    .await
}

impl ExactAvmHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when the localnet tier has no algod, faucet, asset or
    /// PostgreSQL.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let (payer_key, payee_key, other_key, fee_payer_key) =
            (random_key(), random_key(), random_key(), random_key());
        let (algod, url, token, asset, devnet, stores, pg): (_, _, _, _, _, StorePair, _) =
            match tier {
                Tier::Mock => {
                    let issuer = random_key();
                    let token = "conformance".to_owned();
                    let running = Devnet::spawn(
                        DevnetConfig {
                            accounts: vec![
                                (addr(&issuer), ALGO),
                                (addr(&payer_key), ALGO),
                                (addr(&payee_key), ALGO),
                                (addr(&other_key), ALGO),
                                (addr(&fee_payer_key), 10 * ALGO),
                            ],
                            token: Some(token.clone()),
                            ..DevnetConfig::testnet(addr(&issuer))
                        },
                        SocketAddr::from(([127, 0, 0, 1], 0)),
                    )
                    .await
                    .map_err(setup)?;
                    let d = &running.devnet;
                    for k in [&payer_key, &payee_key, &other_key] {
                        d.opt_in(addr(k), TESTNET_USDC).map_err(setup)?;
                    }
                    d.fund_asset(addr(&payer_key), TESTNET_USDC, FUNDED)
                        .map_err(setup)?;
                    d.advance(10);
                    let algod =
                        AlgodClient::new(&running.url, Some(token.clone())).map_err(setup)?;
                    let mem: Arc<dyn KeyStore> =
                        Arc::new(MemoryKeyStore::with_clock(shared.clone()));
                    let url = running.url.clone();
                    (
                        algod,
                        url,
                        Some(token),
                        TESTNET_USDC,
                        Some(running),
                        (mem.clone(), mem),
                        None,
                    )
                }
                Tier::Localnet => {
                    let url = std::env::var("ALGOD_URL").map_err(|_| {
                        HarnessError::Unavailable(
                            "ALGOD_URL is not set (`conformance localnet up` starts algod-devnet)"
                                .into(),
                        )
                    })?;
                    let token = std::env::var("ALGOD_TOKEN").ok();
                    let algod = AlgodClient::new(&url, token.clone()).map_err(setup)?;
                    algod
                        .last_round()
                        .await
                        .map_err(|e| HarnessError::Unavailable(format!("algod at {url}: {e}")))?;
                    let seed = std::env::var("ALGOD_FAUCET_SEED").map_err(|_| {
                        HarnessError::Unavailable("ALGOD_FAUCET_SEED is not set".into())
                    })?;
                    let asset: u64 = std::env::var("ALGOD_USDC_ASSET")
                        .map_err(|_| {
                            HarnessError::Unavailable(
                                "ALGOD_USDC_ASSET is not set (the faucet's USDC)".into(),
                            )
                        })?
                        .parse()
                        .map_err(|_| setup("ALGOD_USDC_ASSET is not an asset id"))?;
                    let faucet: [u8; 32] = BASE64
                        .decode(seed.as_bytes())
                        .ok()
                        .and_then(|v| v.try_into().ok())
                        .ok_or_else(|| setup("ALGOD_FAUCET_SEED is not 32 bytes of base64"))?;
                    let faucet = SigningKey::from_bytes(&faucet);
                    for (k, algo) in [
                        (&payer_key, ALGO),
                        (&payee_key, ALGO),
                        (&other_key, ALGO),
                        (&fee_payer_key, 10 * ALGO),
                    ] {
                        pay(&algod, &faucet, addr(k), algo).await?;
                    }
                    for k in [&payer_key, &payee_key, &other_key] {
                        transfer(&algod, k, addr(k), asset, 0).await?; // opt in
                    }
                    transfer(&algod, &faucet, addr(&payer_key), asset, FUNDED).await?;
                    let schema = super::pg::Schema::create("avm").await?;
                    let (a, b) = (
                        schema.key_store(shared.clone()).await?,
                        schema.key_store(shared.clone()).await?,
                    );
                    (algod, url, token, asset, None, (a, b), Some(schema))
                }
            };
        let connect = |store: Arc<dyn KeyStore>| {
            let algod = algod.clone();
            let fee_payer = FeePayer::new(fee_payer_key.clone());
            async move {
                AvmFacilitator::connect(algod, Some(fee_payer), store)
                    .await
                    .map_err(setup)
            }
        };
        let facilitator = connect(stores.0.clone()).await?;
        let twin_facilitator = connect(stores.1.clone()).await?;
        let scheme = ExactAvm::new(facilitator.clone(), addr(&payee_key), asset, 6);
        let twin_scheme = ExactAvm::new(twin_facilitator.clone(), addr(&payee_key), asset, 6);
        let receiver = AvmReceiver::new(
            scheme.clone(),
            ServedOnce::new(stores.0.clone()),
            shared.clone(),
        );
        let twin_receiver = AvmReceiver::new(
            twin_scheme,
            ServedOnce::new(stores.1.clone()),
            shared.clone(),
        );
        let payer = AvmPayer::connect(
            payer_key.clone(),
            algod.clone(),
            AvmPolicy {
                max_amounts: [(asset, FUNDED * 10)].into_iter().collect(),
                max_fee: 2_000,
            },
        )
        .await
        .map_err(setup)?
        .with_clock(shared.clone());
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer = Arc::new(Idempotent::new(payer, stores.0.clone()));
        let handle = RailHandle {
            payer: payer.clone(),
            hold_payer: None,
            receiver: Arc::new(receiver),
            hold_receiver: None,
            refunds: None,
        };
        let twin = RailHandle {
            payer,
            hold_payer: None,
            receiver: Arc::new(twin_receiver),
            hold_receiver: None,
            refunds: None,
        };
        Ok(ExactAvmHarness {
            handle,
            twin,
            clock,
            algod,
            algod_url: url,
            algod_token: token,
            asset,
            scheme,
            facilitator,
            twin_facilitator,
            payer_key,
            payee: addr(&payee_key),
            other: addr(&other_key),
            fee_payer: addr(&fee_payer_key),
            _devnet: devnet,
            pg,
        })
    }

    /// A devnet control (`/devnet/…`): POST, expecting 200.
    async fn control(&self, path: &str) -> Result<(), String> {
        let http = rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        let mut req = http.post(format!("{}{path}", self.algod_url));
        if let Some(t) = &self.algod_token {
            req = req.header("X-Algo-API-Token", t);
        }
        let r = req.send().await.map_err(|e| e.to_string())?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(format!(
                "the algod at {} has no devnet control {path} ({}): this case needs algod-devnet",
                self.algod_url,
                r.status()
            ))
        }
    }
}

mod checks;

/// Two handles on one record store (two receiver instances).
type StorePair = (Arc<dyn KeyStore>, Arc<dyn KeyStore>);

#[async_trait]
impl StipendexHarness for ExactAvmHarness {
    async fn x402(&self) -> Option<stipendex_conformance::X402Parts> {
        let payer = AvmPayer::connect(
            self.payer_key.clone(),
            self.algod.clone(),
            AvmPolicy {
                max_amounts: [(self.asset, FUNDED * 10)].into_iter().collect(),
                max_fee: 2_000,
            },
        )
        .await
        .ok()?;
        Some(stipendex_conformance::X402Parts {
            scheme: Arc::new(self.scheme.clone()),
            payer: Arc::new(payer),
            pay_to: self.payee.to_string(),
        })
    }
}

#[async_trait]
impl Harness for ExactAvmHarness {
    fn rail(&self) -> &RailHandle {
        &self.handle
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn asset(&self) -> Asset {
        Asset::usdc()
    }
    fn funded(&self) -> u128 {
        u128::from(FUNDED)
    }
    fn other_payee(&self) -> String {
        self.other.to_string()
    }

    async fn balances(&self) -> RailResult<Balances> {
        let read = |a: Address| {
            let algod = self.algod.clone();
            let asset = self.asset;
            async move {
                algod
                    .asset_holding(&a, asset)
                    .await
                    .map(|h| h.map_or(0, |(n, _)| n))
                    .map_err(|e| RailError::Unavailable(RailReason::new("algod", e.to_string())))
            }
        };
        Ok(Balances {
            payer_available: i128::from(read(addr(&self.payer_key)).await?),
            payee_settled: i128::from(read(self.payee).await?),
        })
    }

    fn malformed(&self, valid: &Payment) -> Vec<(String, Payment)> {
        let with = |name: &str, proof: serde_json::Value| {
            let mut p = valid.clone();
            p.proof = proof;
            (name.to_owned(), p)
        };
        let hdr = valid
            .proof
            .get("header")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        vec![
            with(
                "header truncated",
                json!({"header": hdr.get(..hdr.len() / 2).unwrap_or_default()}),
            ),
            with(
                "header with a flipped character",
                json!({"header": flip(&hdr)}),
            ),
            with("header as a number", json!({"header": 1})),
            with(
                "an envelope without its group",
                json!({"header": BASE64.encode(br#"{"x402Version":2,"payload":{},"accepted":{}}"#)}),
            ),
        ]
    }

    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(self.twin.clone())
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        self.checks().await
    }

    async fn teardown(&self) {
        if let Some(schema) = &self.pg {
            schema.drop_all().await;
        }
    }
}

fn flip(s: &str) -> String {
    let mut b = s.as_bytes().to_vec();
    let mid = b.len() / 2;
    if let Some(c) = b.get_mut(mid) {
        *c = if *c == b'A' { b'B' } else { b'A' };
    }
    String::from_utf8(b).unwrap_or_default()
}
