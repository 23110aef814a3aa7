//! # algod-devnet
//!
//! An algod-REST-compatible devnet: the subset of algod's v2 API that payers, receivers and
//! facilitators of exact-algo and of x402's `exact` on Algorand use, over a real in-memory
//! ledger (ALGO, assets, atomic groups) with go-algorand's checks and error strings.
//!
//! AlgoKit LocalNet needs Docker, which CI machines here do not have; this devnet stands in for
//! it. It is a library (tests start it in-process with [`Devnet::spawn`]) and a binary
//! (`algod-devnet`); the chain's state and rules are in [`chain`], the REST routes in [`http`]. A real algod is used instead wherever `ALGOD_URL` is set.
//!
//! # Endpoints (shapes from go-algorand's `daemon/algod/api/algod.oas2.json`)
//! | route | answer |
//! |---|---|
//! | `POST /v2/transactions` | `{"txId"}`; body `application/x-binary`, concatenated signed txns |
//! | `GET /v2/transactions/params` | `{consensus-version, fee, genesis-hash, genesis-id, last-round, min-fee}` |
//! | `GET /v2/transactions/pending/{txid}` | `{confirmed-round, pool-error, txn}` |
//! | `GET /v2/status` | `NodeStatusResponse` |
//! | `GET /v2/status/wait-for-block-after/{round}` | status once a later round exists (≤ 1 min) |
//! | `POST /v2/transactions/simulate` | `SimulateResponse`: `txn-groups[0].failure-message`, `failed-at`; body msgpack, one group, `allow-empty-signatures` honoured |
//! | `GET /v2/accounts/{address}` | `Account` (`amount`, `min-balance`, `auth-addr`, `assets`, …) |
//! | `GET /v2/accounts/{address}/assets/{id}` | `{round, asset-holding: {amount, asset-id, is-frozen}}` (404 when not opted in) |
//! | `GET /v2/assets/{id}` | `Asset` (`index`, `params`: `creator`, `decimals`, `unit-name`, …) |
//! | `GET /health`, `GET /versions` | unauthenticated, as in algod |
//! | `POST /devnet/advance/{n}` | the devnet's own: commits `n` empty blocks |
//! | `POST /devnet/freeze/{address}/{asset}/{true\|false}` | the devnet's own: freezes or unfreezes a holding (an `afrz` stand-in) |
//!
//! Every other route needs `X-Algo-API-Token` when a token is configured (401
//! `{"message":"Invalid API Token"}` otherwise). Errors are `{"message": …}` with 400/404.
//!
//! # Semantics (and where each error string comes from in go-algorand)
//! - Decoding: strict canonical msgpack of native payments and asset transfers only
//!   (`rail_exact_algo::txn`). go-algorand decodes leniently and accepts other transaction
//!   types, multisig and logic signatures; the devnet refuses those with a 400 naming the
//!   problem. This is the one deliberate difference: nothing either Algorand scheme accepts
//!   depends on it. Assets are created at genesis ([`DevnetConfig::assets`];
//!   [`DevnetConfig::testnet`] poses as testnet with its USDC, ASA 10458941) — there is no
//!   `acfg` — and frozen with [`Devnet::set_frozen`] rather than `afrz`.
//! - Asset transfers (`ledger/apply/asset.go`): opt-in by a zero self-transfer, transfers,
//!   clawback (`asnd`, only by the clawback address) and close-to, with `asset N missing from
//!   A` (the sender), `receiver error: must optin, asset N missing from A`, `asset N frozen in
//!   A`, `asset frozen in recipient`, `underflow on subtracting …`, `asset N does not exist or
//!   has been deleted` (an opt-in, a clawback or a close-to only), `cannot close asset ID in
//!   allocating account`; an account with holdings cannot close its ALGO (`cannot close: N outstanding
//!   assets`); each holding adds 0.1 ALGO to the minimum balance.
//! - Simulate evaluates the group exactly as a submission against the next round and applies
//!   nothing; an unsigned member is refused (`signedtxn has no sig`) unless
//!   `allow-empty-signatures` is set, and a present signature is always checked.
//! - Well-formedness (`data/transactions/transaction.go` `WellFormed`): `transaction invalid
//!   range (fv--lv)`, `transaction window size excessive (fv--lv)`; fees per group
//!   (`data/transactions/verify/txn.go`): `txgroup had N in fees, which is less than the minimum
//!   K * 1000`.
//! - Signatures (`crypto/batchverifier.go` `ErrBatchHasFailedSigs`): `At least one signature
//!   didn't pass verification`. Ed25519 is checked with `verify_strict`.
//! - Pool and evaluator, prefixed `TransactionPool.Remember: ` (`data/pools/transactionPool.go`):
//!   `txn dead: round R outside of fv--lv` (`data/bookkeeping/block.go` `TxnDeadError`),
//!   `tx.GenesisHash <…> does not match expected <…>`, `transaction already in ledger: TXID`
//!   (`ledger/ledgercore/error.go`), `transaction TXID: should have been authorized by A but was
//!   actually authorized by B` (`ledger/eval`), `overspend (account A, data {…}, tried to spend
//!   {N})` and `account A balance N below min 100000 (0 assets)` (`ledger/ledgercore/error.go`).
//!   The `data` part of an overspend is abridged to the balance.
//! - Rounds: every accepted group is committed in a block of its own (algod's dev mode), so
//!   its `confirmed-round` is the next round; [`Devnet::advance`] adds empty blocks, and
//!   [`DevnetConfig::block_time`] makes rounds advance on a timer as on a real network.
//! - Minimum balance 0.1 ALGO, minimum fee 1000 µALGO, validity window ≤ 1000 rounds, txids
//!   remembered for 1000 rounds (duplicates refused), leases honoured, close-to and rekey applied.
//!
//! ```
//! # async fn demo() -> std::io::Result<()> {
//! use algod_devnet::{Devnet, DevnetConfig};
//! let running = Devnet::spawn(DevnetConfig::default(), "127.0.0.1:0".parse().unwrap()).await?;
//! assert!(running.url.starts_with("http://127.0.0.1:"));
//! assert_eq!(running.devnet.round(), 1);
//! # Ok(()) }
//! ```

pub mod chain;
pub mod example;
pub mod http;

pub use chain::{
    AssetConfig, Devnet, DevnetConfig, MIN_BALANCE, MIN_FEE, Refused, Simulated,
    TESTNET_GENESIS_HASH, TESTNET_GENESIS_ID, TESTNET_USDC,
};
pub use http::RunningDevnet;
