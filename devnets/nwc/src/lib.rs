//! # nwc-devnet
//!
//! A NIP-47 devnet for the `ln-nwc` rail (`rail-ln-nwc`): an NWC wallet service serving several wallets over a real (in-process)
//! nostr relay, backed by an in-memory Lightning network.
//!
//! - [`Relay`]: `nostr_relay_builder::LocalRelay` behind a `TCP_NODELAY` accept loop, raised rate
//!   limits, stop/resume/restart on the same port.
//! - [`Network`]: wallets (msat balances, one secp256k1 node key each), regtest BOLT11 invoices
//!   signed by the payee's node key, atomic payments, hold invoices (lock → settle/cancel/expire),
//!   notifications.
//! - [`WalletService`]: the NIP-47 side — info events, requests (NIP-44 v2 or NIP-04, dedupe,
//!   expiration), responses, notifications (23197 / 23196), resubscription after reconnects,
//!   and per-wallet [`Faults`].
//! - [`Devnet`]: the three together.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nwc_devnet::DevnetError> {
//! use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
//! let devnet = Devnet::start(DevnetConfig::default()).await?;
//! let alice = devnet.create_wallet(WalletSpec::new("alice", 1_000_000)).await?;
//! println!("{}", alice.uri); // nostr+walletconnect://…
//! devnet.shutdown().await;
//! # Ok(()) }
//! ```

mod network;
mod relay;
mod service;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

pub use network::{
    BLOCK_HEIGHT, DEFAULT_EXPIRY_SECS, DEFAULT_MIN_FINAL_CLTV, ListFilter, Lookup, NetError,
    NetEvent, Network, NotificationKind, Paid,
};
pub use relay::{Relay, RelayConfig};
pub use service::{ConnectionSpec, Faults, METHODS, OUT_OF_ORDER_HOLD, WalletService};

use rail_ln_nwc::nip47::ConnectionUri;
use rail_ln_nwc::wire::WireError;

/// Why the devnet failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevnetError {
    /// The relay could not start.
    #[error("relay: {0}")]
    Relay(String),
    /// Socket trouble.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The service's nostr client failed.
    #[error("nostr client: {0}")]
    Client(String),
    /// Building an event failed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// No wallet by that name.
    #[error("unknown wallet {0}")]
    UnknownWallet(String),
    /// A refusal of the network.
    #[error(transparent)]
    Network(#[from] NetError),
    /// Something did not happen in time.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// How to start a [`Devnet`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevnetConfig {
    /// The relay's address (default 127.0.0.1).
    pub relay_ip: IpAddr,
    /// The relay's port (default: any free one).
    pub relay_port: Option<u16>,
    /// `TCP_NODELAY` accept loop (default `true`; `false` = plain `LocalRelay::run`, ~40 ms per
    /// hop).
    pub nodelay: bool,
}

impl Default for DevnetConfig {
    fn default() -> Self {
        DevnetConfig {
            relay_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            relay_port: None,
            nodelay: true,
        }
    }
}

/// A wallet to create.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalletSpec {
    /// Its name (also its `get_info` alias).
    pub name: String,
    /// Opening balance, msat.
    pub balance_msat: u64,
    /// Its connection speaks NIP-04 only.
    pub nip04_only: bool,
    /// Only these methods for its connection (`RESTRICTED` otherwise); `None` = all.
    pub allowed_methods: Option<Vec<String>>,
    /// Total msat its connection may pay (`QUOTA_EXCEEDED` beyond); `None` = unlimited.
    pub budget_msat: Option<u64>,
}

impl WalletSpec {
    /// A wallet with all methods, NIP-44 and NIP-04, no budget.
    #[must_use]
    pub fn new(name: impl Into<String>, balance_msat: u64) -> Self {
        WalletSpec {
            name: name.into(),
            balance_msat,
            ..WalletSpec::default()
        }
    }
}

/// A created wallet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalletHandle {
    /// Its name.
    pub name: String,
    /// Its connection URI (contains the client secret).
    pub uri: ConnectionUri,
    /// Its node's public key (hex): its invoices are signed by it.
    pub node_pubkey: String,
}

/// Relay + network + wallet service.
#[derive(Debug)]
pub struct Devnet {
    relay: Relay,
    network: Network,
    service: WalletService,
    /// The service's connections to the relay when it was last stopped.
    connections_at_stop: std::sync::atomic::AtomicUsize,
}

impl Devnet {
    /// Starts the relay and the wallet service (no wallets yet).
    ///
    /// # Errors
    /// [`DevnetError`] if the relay cannot bind or the service cannot connect.
    pub async fn start(config: DevnetConfig) -> Result<Devnet, DevnetError> {
        let relay = Relay::start(RelayConfig {
            ip: config.relay_ip,
            port: config.relay_port,
            nodelay: config.nodelay,
        })
        .await?;
        let network = Network::new();
        let service = WalletService::start(relay.url(), network.clone()).await?;
        Ok(Devnet {
            relay,
            network,
            service,
            connections_at_stop: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// `ws://IP:PORT`.
    #[must_use]
    pub fn relay_url(&self) -> &str {
        self.relay.url()
    }

    /// The relay.
    #[must_use]
    pub fn relay(&self) -> &Relay {
        &self.relay
    }

    /// The Lightning side (direct access: make invoices, pay, fund, inspect).
    #[must_use]
    pub fn network(&self) -> &Network {
        &self.network
    }

    /// The wallet service.
    #[must_use]
    pub fn service(&self) -> &WalletService {
        &self.service
    }

    /// Creates a wallet (node key, balance) and its connection; returns once requests to it
    /// are being served.
    ///
    /// # Errors
    /// [`DevnetError::Network`] (`OTHER`) if the name is taken; relay trouble.
    pub async fn create_wallet(&self, spec: WalletSpec) -> Result<WalletHandle, DevnetError> {
        let node_pubkey = self.network.add_wallet(&spec.name, spec.balance_msat)?;
        let uri = self
            .service
            .add_connection(ConnectionSpec {
                wallet: spec.name.clone(),
                nip04_only: spec.nip04_only,
                allowed_methods: spec.allowed_methods,
                budget_msat: spec.budget_msat,
            })
            .await?;
        Ok(WalletHandle {
            name: spec.name,
            uri,
            node_pubkey,
        })
    }

    /// Another connection (own keys) to an existing wallet.
    ///
    /// # Errors
    /// [`DevnetError::UnknownWallet`]; relay trouble.
    pub async fn connect(&self, spec: ConnectionSpec) -> Result<ConnectionUri, DevnetError> {
        self.service.add_connection(spec).await
    }

    /// Spendable msat of a wallet (locked hold payments excluded).
    ///
    /// # Errors
    /// [`DevnetError::UnknownWallet`].
    pub fn balance_msat(&self, name: &str) -> Result<u64, DevnetError> {
        self.network
            .balance_msat(name)
            .map_err(|_| DevnetError::UnknownWallet(name.to_owned()))
    }

    /// msat a wallet has locked in unsettled hold payments.
    ///
    /// # Errors
    /// [`DevnetError::UnknownWallet`].
    pub fn locked_msat(&self, name: &str) -> Result<u64, DevnetError> {
        self.network
            .locked_msat(name)
            .map_err(|_| DevnetError::UnknownWallet(name.to_owned()))
    }

    /// Sets a wallet's faults (all its connections), effective for the next request.
    ///
    /// # Errors
    /// [`DevnetError::UnknownWallet`].
    pub fn set_faults(&self, name: &str, faults: Faults) -> Result<(), DevnetError> {
        if !self.network.wallets().iter().any(|w| w == name) {
            return Err(DevnetError::UnknownWallet(name.to_owned()));
        }
        self.service.set_faults(name, faults);
        Ok(())
    }

    /// A wallet's current faults.
    #[must_use]
    pub fn faults(&self, name: &str) -> Faults {
        self.service.faults(name)
    }

    /// Takes the relay down (clients are disconnected and keep retrying).
    pub async fn stop_relay(&self) {
        if let Ok(n) = self.service.connections().await {
            self.connections_at_stop
                .store(n, std::sync::atomic::Ordering::Relaxed);
        }
        self.relay.stop().await;
    }

    /// Brings the relay back on the same port and waits until the wallet service is
    /// reconnected and subscribed again.
    ///
    /// # Errors
    /// [`DevnetError`] if the port cannot be bound or the service does not come back within
    /// 10 s.
    pub async fn resume_relay(&self) -> Result<(), DevnetError> {
        self.relay.resume().await?;
        let before = self
            .connections_at_stop
            .load(std::sync::atomic::Ordering::Relaxed);
        self.service
            .wait_ready_after(before, Duration::from_secs(20))
            .await
    }

    /// [`Devnet::stop_relay`] then [`Devnet::resume_relay`].
    ///
    /// # Errors
    /// As [`Devnet::resume_relay`].
    pub async fn restart_relay(&self) -> Result<(), DevnetError> {
        self.stop_relay().await;
        self.resume_relay().await
    }

    /// Stops the service and the relay.
    pub async fn shutdown(self) {
        self.service.shutdown().await;
        self.relay.shutdown().await;
    }
}
