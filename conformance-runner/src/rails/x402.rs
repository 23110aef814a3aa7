//! The x402 rail's harness.
//!
//! - **mock**: [`DevnetFacilitator`] — an in-memory EIP-3009 token behind the facilitator API
//!   (real signatures and EIP-712 digests, in-memory balances and nonces), served-payment
//!   records in memory.
//! - **localnet**: anvil with Circle's FiatTokenV2_2 (`X402_RPC_URL`, `X402_TOKEN`,
//!   `X402_MINTER`, … from `scripts/x402/localnet.mjs`): a [`LocalFacilitator`] per receiver
//!   with its own settling key, settlement and served-payment records in PostgreSQL shared by
//!   two receiver instances.
//!
//! The payer pays no gas (the facilitator does), so balances are token balances exactly.

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use async_trait::async_trait;
use futures::future::BoxFuture;
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, KeyStore, ManualClock, MemoryKeyStore, Payment, RailError, RailHandle, RailReason,
    RailResult, SharedClock,
};
use rail_x402::Token;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{LocalFacilitator, X402Facilitator, X402SettlementBook};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::rail::{TokenBalance, X402RailPayer, X402Receiver};
use serde_json::json;
use x402_devnet::DevnetFacilitator;
use x402_devnet::anvil::Localnet;

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// x402 in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "x402",
    tiers: &[
        (
            Tier::Mock,
            "in-memory EIP-3009 token behind the facilitator API (real signatures), records in memory",
        ),
        (
            Tier::Localnet,
            "anvil with Circle's FiatTokenV2_2 (X402_RPC_URL), local facilitators, records in PostgreSQL shared by two receivers",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = X402Harness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// Atomic units (USDC, 6 decimals) the payer starts with: 10 USDC.
const FUNDED: u64 = 10_000_000;

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

/// What a tier provides: the chain, the token, two facilitators, two stores (two receiver
/// instances), the PostgreSQL schema to drop, and where the payer reads its balance.
type Parts = (
    Chain,
    Token,
    (Arc<dyn X402Facilitator>, Arc<dyn X402Facilitator>),
    (Arc<dyn KeyStore>, Arc<dyn KeyStore>),
    Option<super::pg::Schema>,
    Arc<dyn TokenBalance>,
);

enum Chain {
    Mock(Arc<DevnetFacilitator>),
    Anvil(Localnet),
}

/// A payer, a payee and another payee on one token, the rail's two sides on top.
pub struct X402Harness {
    handle: RailHandle,
    twin: RailHandle,
    clock: ManualClock,
    chain: Chain,
    token: Address,
    payer: Address,
    payee: Address,
    other: Address,
    pg: Option<super::pg::Schema>,
    facilitator: Arc<dyn X402Facilitator>,
    token_info: Token,
    payer_key: LocalSigner,
}

impl X402Harness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when the localnet tier has no anvil or PostgreSQL.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let payer_key = LocalSigner::random();
        let payee = LocalSigner::random().address();
        let other = LocalSigner::random().address();
        let (chain, token, facilitators, stores, pg, balances): Parts = match tier {
            Tier::Mock => {
                let token = Token::new("eip155:31337", Address::repeat_byte(0x5c), "USD Coin", "2");
                let mock = Arc::new(DevnetFacilitator::new(&token.network));
                mock.mint(token.address, payer_key.address(), U256::from(FUNDED))
                    .map_err(setup)?;
                let mem: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(shared.clone()));
                let f: Arc<dyn X402Facilitator> = mock.clone();
                let b: Arc<dyn TokenBalance> = mock.clone();
                (
                    Chain::Mock(mock),
                    token,
                    (f.clone(), f),
                    (mem.clone(), mem),
                    None,
                    b,
                )
            }
            Tier::Localnet => {
                if std::env::var("X402_RPC_URL").is_err() {
                    return Err(HarnessError::Unavailable(
                        "X402_RPC_URL is not set (`conformance localnet up` starts anvil + FiatTokenV2_2)".into(),
                    ));
                }
                let net = Localnet::from_env()
                    .await
                    .ok_or_else(|| HarnessError::Unavailable("x402 anvil not reachable".into()))?;
                net.mint(payer_key.address(), U256::from(FUNDED))
                    .await
                    .map_err(setup)?;
                let schema = super::pg::Schema::create("x402").await?;
                let (a, b) = (
                    schema.key_store(shared.clone()).await?,
                    schema.key_store(shared.clone()).await?,
                );
                let mut fs = Vec::new();
                for store in [&a, &b] {
                    let settler = net.funded_settler().await.map_err(setup)?;
                    let f = LocalFacilitator::connect(
                        net.rpc.clone(),
                        settler,
                        X402SettlementBook::new(store.clone()),
                    )
                    .await
                    .map_err(setup)?;
                    fs.push(Arc::new(f) as Arc<dyn X402Facilitator>);
                }
                let token = net.token.clone();
                let f2 = fs.pop().ok_or_else(|| setup("no facilitator"))?;
                let f1 = fs.pop().ok_or_else(|| setup("no facilitator"))?;
                let balances: Arc<dyn TokenBalance> = Arc::new(net.rpc.clone());
                (
                    Chain::Anvil(net),
                    token,
                    (f1, f2),
                    (a, b),
                    Some(schema),
                    balances,
                )
            }
        };
        let policy = Policy::new(
            &token.network,
            token.address,
            U256::from(FUNDED) * U256::from(10),
        );
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer = Arc::new(Idempotent::new(
            X402RailPayer::new(
                X402Payer::new(payer_key.clone(), policy),
                balances,
                shared.clone(),
            ),
            stores.0.clone(),
        ));
        let facilitator = facilitators.0.clone();
        let receiver = X402Receiver::new(
            facilitators.0,
            token.clone(),
            payee,
            stores.0.clone(),
            shared.clone(),
        );
        let twin = X402Receiver::new(facilitators.1, token.clone(), payee, stores.1, shared);
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
            receiver: Arc::new(twin),
            hold_receiver: None,
            refunds: None,
        };
        Ok(Self {
            handle,
            twin,
            clock,
            chain,
            token: token.address,
            payer: payer_key.address(),
            payer_key: payer_key.clone(),
            payee,
            other,
            pg,
            facilitator,
            token_info: token,
        })
    }

    async fn balance(&self, who: Address) -> RailResult<U256> {
        let down = |e: String| RailError::Unavailable(RailReason::new("x402 chain", e));
        match &self.chain {
            Chain::Mock(m) => m.balance(self.token, who).map_err(|e| down(e.to_string())),
            Chain::Anvil(net) => net.balance(who).await.map_err(|e| down(e.to_string())),
        }
    }
}

fn signed(u: U256) -> RailResult<i128> {
    i128::try_from(u).map_err(|_| {
        RailError::Unavailable(RailReason::new(
            "x402 chain",
            format!("balance {u} overflows i128"),
        ))
    })
}

#[async_trait]
impl StipendexHarness for X402Harness {
    async fn x402(&self) -> Option<stipendex_conformance::X402Parts> {
        let scheme = rail_x402::ExactEvm::new(
            self.facilitator.clone(),
            self.token_info.clone(),
            self.payee,
        );
        let payer = X402Payer::new(
            self.payer_key.clone(),
            Policy::new(
                &self.token_info.network,
                self.token,
                U256::from(FUNDED) * U256::from(10),
            ),
        );
        Some(stipendex_conformance::X402Parts {
            scheme: Arc::new(scheme),
            payer: Arc::new(payer),
            pay_to: format!("{:#x}", self.payee),
        })
    }
}

#[async_trait]
impl Harness for X402Harness {
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
        self.other.to_checksum(None)
    }

    async fn balances(&self) -> RailResult<Balances> {
        Ok(Balances {
            payer_available: signed(self.balance(self.payer).await?)?,
            payee_settled: signed(self.balance(self.payee).await?)?,
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
            with("header as a number", json!({"header": 1})),
            with(
                "x402Version 1 header",
                json!({"header": "eyJ4NDAyVmVyc2lvbiI6MX0="}),
            ),
        ]
    }

    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(self.twin.clone())
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        let (mock, net) = match &self.chain {
            Chain::Mock(m) => (Some(m), None),
            Chain::Anvil(n) => (None, Some(n)),
        };
        super::x402_checks::run(&super::x402_checks::Ctx {
            facilitator: self.facilitator.clone(),
            token: self.token_info.clone(),
            mock,
            net,
        })
        .await
    }

    async fn teardown(&self) {
        if let Some(schema) = &self.pg {
            schema.drop_all().await;
        }
    }
}
