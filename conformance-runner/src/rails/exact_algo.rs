//! The exact-algo rail's harness.
//!
//! - **mock**: the algod-compatible devnet in process (real HTTP on a loopback port), paymentIds
//!   in memory.
//! - **localnet**: the algod at `ALGOD_URL` (the `algod-devnet` binary in CI, or a real algod:
//!   `algokit localnet start`), with `ALGOD_TOKEN` and a faucet key `ALGOD_FAUCET_SEED` (base64
//!   of a 32-byte Ed25519 seed) whose account funds each harness with real payments; paymentIds
//!   in PostgreSQL, shared by two receiver instances with their own connection pools.
//!
//! Fees are the rail's, not the price: the harness adds back the fees its receivers saw the payer
//! pay, so the suite's price arithmetic holds; fee rules are checked by the rail's own cases
//! ([`Harness::rail_checks`], in `checks`: every rule of `docs/exact-algo.md` §3 and each error
//! code).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use algod_devnet::{Devnet, DevnetConfig, RunningDevnet};
use async_trait::async_trait;
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use futures::future::BoxFuture;
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, KeyStore, ManualClock, MemoryKeyStore, Payment, RailError, RailHandle, RailResult,
    SharedClock,
};
use rail_exact_algo::msgpack::{self, Value};
use rail_exact_algo::receiver::OnSettled;
use rail_exact_algo::txn::PayTxn;
use rail_exact_algo::wire::{
    Envelope, ErrorCode, Payload, SEED_ERRORS, SETTLEMENT_FAILED, TRANSACTION_EXPIRED,
    UNKNOWN_OR_EXPIRED_PAYMENT_ID, header,
};
use rail_exact_algo::{Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy, Price};
use serde_json::json;

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// exact-algo in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "exact-algo",
    tiers: &[
        (
            Tier::Mock,
            "algod-compatible devnet in process over HTTP, paymentIds in memory",
        ),
        (
            Tier::Localnet,
            "algod at ALGOD_URL (algod-devnet or a real algod) funded from ALGOD_FAUCET_SEED, paymentIds in PostgreSQL shared by two receivers",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = ExactAlgoHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// µALGO the payer starts with.
const FUNDED: u64 = 10_000_000;
/// µALGO each other account starts with (the minimum balance plus a little).
const SEED_BALANCE: u64 = 200_000;

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

fn random_key() -> SigningKey {
    SigningKey::from_bytes(&rand::random::<[u8; 32]>())
}

/// A payer, a payee and another payee on an algod, the rail's two sides on top.
pub struct ExactAlgoHarness {
    handle: RailHandle,
    twin: RailHandle,
    clock: ManualClock,
    algod: AlgodClient,
    receiver: ExactAlgoReceiver,
    payer_key: SigningKey,
    payee: Address,
    other: Address,
    /// A funded account used for the rekey case (its own key, then rekeyed).
    spare_key: SigningKey,
    fees: Arc<AtomicU64>,
    _devnet: Option<RunningDevnet>,
    pg: Option<super::pg::Schema>,
}

async fn fund(
    algod: &AlgodClient,
    faucet: &SigningKey,
    to: &[(Address, u64)],
) -> Result<(), HarnessError> {
    for (a, amount) in to {
        let p = algod.params().await.map_err(setup)?;
        let t = PayTxn {
            sender: addr(faucet),
            receiver: *a,
            amount: *amount,
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
        }
        .sign(faucet, None);
        let txid = algod
            .submit(&t.encode())
            .await
            .map_err(|e| setup(format!("funding {a}: {e}")))?;
        algod
            .wait_for_confirmation(&txid, t.txn.last_valid)
            .await
            .map_err(setup)?;
    }
    Ok(())
}

impl ExactAlgoHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when the localnet tier has no algod, faucet or PostgreSQL.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let payer_key = random_key();
        let spare_key = random_key();
        let payee = addr(&random_key());
        let other = addr(&random_key());
        let accounts = vec![
            (addr(&payer_key), FUNDED),
            (payee, SEED_BALANCE),
            (other, SEED_BALANCE),
            (addr(&spare_key), 1_000_000),
        ];
        let (algod, devnet, stores, pg): (_, _, StorePair, _) = match tier {
            Tier::Mock => {
                let running = Devnet::spawn(
                    DevnetConfig {
                        accounts,
                        token: Some("conformance".into()),
                        ..DevnetConfig::default()
                    },
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                )
                .await
                .map_err(setup)?;
                let algod =
                    AlgodClient::new(&running.url, Some("conformance".into())).map_err(setup)?;
                // Some rounds of history, so "last valid round passed" can be built.
                running.devnet.advance(10);
                let mem: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(shared.clone()));
                (algod, Some(running), (mem.clone(), mem), None)
            }
            Tier::Localnet => {
                let url = std::env::var("ALGOD_URL").map_err(|_| {
                    HarnessError::Unavailable(
                        "ALGOD_URL is not set (`conformance localnet up` starts algod-devnet; or `algokit localnet start`)"
                            .into(),
                    )
                })?;
                let token = std::env::var("ALGOD_TOKEN").ok();
                let algod = AlgodClient::new(&url, token).map_err(setup)?;
                algod
                    .last_round()
                    .await
                    .map_err(|e| HarnessError::Unavailable(format!("algod at {url}: {e}")))?;
                let seed = std::env::var("ALGOD_FAUCET_SEED").map_err(|_| {
                    HarnessError::Unavailable("ALGOD_FAUCET_SEED is not set".into())
                })?;
                let faucet: [u8; 32] = BASE64
                    .decode(seed.as_bytes())
                    .ok()
                    .and_then(|v| v.try_into().ok())
                    .ok_or_else(|| setup("ALGOD_FAUCET_SEED is not 32 bytes of base64"))?;
                fund(&algod, &SigningKey::from_bytes(&faucet), &accounts).await?;
                let schema = super::pg::Schema::create("algo").await?;
                let (a, b) = (
                    schema.key_store(shared.clone()).await?,
                    schema.key_store(shared.clone()).await?,
                );
                (algod, None, (a, b), Some(schema))
            }
        };
        let fees = Arc::new(AtomicU64::new(0));
        let payer_addr = addr(&payer_key);
        let seen = fees.clone();
        let hook: OnSettled = Arc::new(move |s| {
            if s.payer == payer_addr {
                seen.fetch_add(s.fee, Ordering::SeqCst);
            }
        });
        let receiver =
            ExactAlgoReceiver::connect(algod.clone(), payee, stores.0.clone(), shared.clone())
                .await
                .map_err(setup)?
                .on_settled(hook.clone());
        let twin_receiver =
            ExactAlgoReceiver::connect(algod.clone(), payee, stores.1.clone(), shared.clone())
                .await
                .map_err(setup)?
                .on_settled(hook);
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer = Arc::new(Idempotent::new(
            ExactAlgoPayer::new(
                payer_key.clone(),
                algod.clone(),
                Policy {
                    max_amount: FUNDED * 10,
                    ..Policy::default()
                },
                stores.0.clone(),
                shared.clone(),
            ),
            stores.0.clone(),
        ));
        let handle = RailHandle {
            payer: payer.clone(),
            hold_payer: None,
            receiver: Arc::new(receiver.clone()),
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
        Ok(ExactAlgoHarness {
            handle,
            twin,
            clock,
            algod,
            receiver,
            payer_key,
            payee,
            other,
            spare_key,
            fees,
            _devnet: devnet,
            pg,
        })
    }
}

mod checks;

/// Two handles on one paymentId store (two receiver instances).
type StorePair = (Arc<dyn KeyStore>, Arc<dyn KeyStore>);

#[async_trait]
impl StipendexHarness for ExactAlgoHarness {
    async fn x402(&self) -> Option<stipendex_conformance::X402Parts> {
        let clock: SharedClock = Arc::new(self.clock.clone());
        let payer = ExactAlgoPayer::new(
            self.payer_key.clone(),
            self.algod.clone(),
            Policy {
                max_amount: FUNDED * 10,
                ..Policy::default()
            },
            Arc::new(rail_core::MemoryKeyStore::with_clock(clock.clone())),
            clock,
        )
        .for_client()
        .await
        .ok()?;
        Some(stipendex_conformance::X402Parts {
            scheme: Arc::new(rail_exact_algo::ExactAlgo::new(self.receiver.clone())),
            payer: Arc::new(payer),
            pay_to: self.payee.to_string(),
        })
    }
}

#[async_trait]
impl Harness for ExactAlgoHarness {
    fn rail(&self) -> &RailHandle {
        &self.handle
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn asset(&self) -> Asset {
        Asset::algo()
    }
    fn funded(&self) -> u128 {
        u128::from(FUNDED)
    }
    fn other_payee(&self) -> String {
        self.other.to_string()
    }

    async fn balances(&self) -> RailResult<Balances> {
        let unavailable = |e: rail_exact_algo::AlgodError| {
            RailError::Unavailable(rail_core::RailReason::new("algod", e.to_string()))
        };
        let payer = self
            .algod
            .account(&addr(&self.payer_key))
            .await
            .map_err(unavailable)?;
        let payee = self.algod.account(&self.payee).await.map_err(unavailable)?;
        Ok(Balances {
            payer_available: i128::from(payer.amount)
                + i128::from(self.fees.load(Ordering::SeqCst)),
            payee_settled: i128::from(payee.amount),
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
            with(
                "header of the SDK golden vector",
                json!({"header": "eyJ4NDAyVmVyc2lvbiI6MiwgInNjaGVtZSI6ICJleGFjdCJ9"}),
            ),
            with("header as a number", json!({"header": 1})),
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
