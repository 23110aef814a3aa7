//! The workspace's own localnets, started on demand for the localnet tier.
//!
//! The localnet tier of every rail finds its localnet through environment variables (the same
//! ones `cargo test --workspace` reads):
//!
//! | localnet | started as | variables |
//! | --- | --- | --- |
//! | [`Kind::Algod`] | `algod_devnet`, in process | `ALGOD_URL`, `ALGOD_TOKEN`, `ALGOD_FAUCET_SEED`, `ALGOD_USDC_ASSET` (the faucet holds its supply) |
//! | [`Kind::Stripe`] | `stripe_emulator`, in process | `STRIPE_EMULATOR_URL` |
//! | [`Kind::Nwc`] | `nwc_devnet`, in process | `NWC_PAYER_URI`, `NWC_PAYEE_URI`, `NWC_OTHER_URI` |
//! | [`Kind::X402`] | `node scripts/x402/localnet.mjs` (anvil + FiatTokenV2_2), a child process | `X402_RPC_URL`, `X402_NETWORK`, `X402_TOKEN`, … |
//!
//! [`Localnets::start`] starts each wanted localnet whose variables the environment does not
//! already name (a localnet named by the environment, e.g. a real algod behind `ALGOD_URL`, is
//! used as it is), and collects the variables of those it started ([`Localnets::vars`]). The
//! in-process ones are real TCP servers on `127.0.0.1` (HTTP, WebSocket), reached exactly as the
//! standalone binaries (`algod-devnet`, `stripe-emulator`, `nwc-devnet`) would be; they live as
//! long as this process's Tokio runtime and the [`Localnets`] value. The x402 localnet needs
//! Node.js ≥ 20 and npm: `scripts/x402/install.sh` (idempotent `npm ci`) runs first, then
//! `localnet.mjs` runs in a process group of its own, so that [`Localnets::stop`] (or dropping
//! the value) can end it and its anvil together; it is also started with `--exit-with-parent`,
//! so it follows this process out even if this process is killed outright.
//!
//! A localnet that cannot start is reported in [`Localnets::failures`] with one sentence naming
//! what is missing and what to do; the others start all the same, and that rail's localnet tier
//! is then skipped, or failed in CI, by the usual rule ([`test_kit::localnet`]).
//!
//! PostgreSQL is not started here: it stays a service (`STIPENDEX_PG_URL`, or the one at
//! `127.0.0.1:5432` that `scripts/setup-localnets` installs and starts).
//!
//! ```no_run
//! # async fn demo() {
//! use conformance_runner::localnet::{Kind, Localnets, Options};
//! let nets = Localnets::start(&Options::new(Kind::ALL.to_vec())).await;
//! for problem in nets.failures() {
//!     eprintln!("{problem}");
//! }
//! let child = std::process::Command::new("cargo")
//!     .args(["test", "-p", "rail-x402", "--test", "interop"])
//!     .envs(nets.vars().iter().map(|(k, v)| (k, v)))
//!     .status();
//! nets.stop().await;
//! # }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use data_encoding::BASE64;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How long `localnet.mjs` may take to deploy FiatTokenV2_2 and report ready (it takes 1–3 s).
const X402_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `localnet.mjs` and its anvil get to exit after SIGTERM before SIGKILL.
const X402_STOP_GRACE: Duration = Duration::from_secs(5);
/// The algod devnet's faucet balance, µALGO (as `algod-devnet --faucet-seed`).
const ALGOD_FAUCET_MICROALGOS: u64 = 1_000_000_000_000_000;
/// The NWC payer wallet's opening balance, msat (as `scripts/test-all` gave `nwc-devnet`).
const NWC_PAYER_MSAT: u64 = 1_000_000_000;

/// One of the localnets this workspace can start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The algod-REST-compatible devnet (exact-algo's localnet).
    Algod,
    /// The stateful Stripe API emulator (stripe's localnet).
    Stripe,
    /// The NWC wallet service over a relay, with an in-memory Lightning network (ln-nwc's).
    Nwc,
    /// anvil with Circle's FiatTokenV2_2 (x402's localnet), from `scripts/x402/localnet.mjs`.
    X402,
}

impl Kind {
    /// Every localnet, in the order they are reported.
    pub const ALL: [Kind; 4] = [Kind::Algod, Kind::Stripe, Kind::Nwc, Kind::X402];

    /// Its name, as in messages.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Kind::Algod => "algod-devnet",
            Kind::Stripe => "stripe-emulator",
            Kind::Nwc => "nwc-devnet",
            Kind::X402 => "anvil + FiatTokenV2_2",
        }
    }

    /// The variable that, when set (and not empty), names an external localnet of this kind:
    /// then none is started.
    #[must_use]
    pub fn marker(self) -> &'static str {
        match self {
            Kind::Algod => "ALGOD_URL",
            Kind::Stripe => "STRIPE_EMULATOR_URL",
            Kind::Nwc => "NWC_PAYER_URI",
            Kind::X402 => "X402_RPC_URL",
        }
    }

    /// The localnet the rail named `rail` needs (besides PostgreSQL), if any: none for the
    /// ledger and the account rail (its facilitator is served in process).
    #[must_use]
    pub fn for_rail(rail: &str) -> Option<Kind> {
        match rail {
            "exact-algo" | "exact-avm" => Some(Kind::Algod),
            "stripe" => Some(Kind::Stripe),
            "ln-nwc" => Some(Kind::Nwc),
            "x402" => Some(Kind::X402),
            _ => None,
        }
    }

    /// Whether the environment already names a localnet of this kind ([`Kind::marker`]).
    #[must_use]
    pub fn named_by_env(self) -> bool {
        std::env::var_os(self.marker()).is_some_and(|v| !v.is_empty())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`Localnets::start`] starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The localnets wanted; those [`Kind::named_by_env`] are skipped.
    pub kinds: Vec<Kind>,
    /// The repository's root (it holds `scripts/x402/`); [`default_repo`] unless overridden.
    pub repo: PathBuf,
}

impl Options {
    /// `kinds`, with the repository this binary was built from.
    #[must_use]
    pub fn new(kinds: Vec<Kind>) -> Self {
        Options {
            kinds,
            repo: default_repo(),
        }
    }
}

/// The repository this binary was built from: the parent of `conformance-runner/`.
#[must_use]
pub fn default_repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Why a localnet did not start. Each message is one sentence naming what is missing and what to
/// do about it.
#[derive(Debug, thiserror::Error)]
pub enum LocalnetError {
    /// An in-process server could not bind or start.
    #[error("{kind} could not start on 127.0.0.1 ({why}); free a port or set {marker} to a running one", marker = kind.marker())]
    Start {
        /// Which localnet.
        kind: Kind,
        /// The error.
        why: String,
    },
    /// A program the x402 localnet needs is not on `PATH`.
    #[error(
        "the x402 localnet needs Node.js >= 20 and npm, but `{program}` is not on PATH; install them (Debian: apt-get install nodejs npm) or set X402_RPC_URL to a running localnet"
    )]
    MissingProgram {
        /// `node` or `npm`.
        program: &'static str,
    },
    /// `scripts/x402/` is not where it should be.
    #[error("{} is missing, so the x402 localnet cannot start; pass --repo with the repository's root", .path.display())]
    NoScripts {
        /// The file looked for.
        path: PathBuf,
    },
    /// `scripts/x402/install.sh` failed.
    #[error(
        "scripts/x402/install.sh (npm ci) failed ({why}), so the x402 localnet did not start; run it by hand to see why"
    )]
    Install {
        /// Its exit status or spawn error.
        why: String,
    },
    /// `localnet.mjs` exited, failed to spawn, or did not report ready.
    #[error(
        "the x402 localnet (node scripts/x402/localnet.mjs) did not come up: {why}; run it by hand to see why"
    )]
    X402 {
        /// What went wrong, with the last line it logged.
        why: String,
    },
}

/// A localnet that was started, and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// Which one.
    pub kind: Kind,
    /// Its URL (relay URL for NWC, JSON-RPC for anvil).
    pub url: String,
}

/// The localnets started by [`Localnets::start`]: their variables, and their handles until
/// [`Localnets::stop`] (dropping the value stops them too, less gracefully).
#[derive(Default)]
pub struct Localnets {
    vars: Vec<(String, String)>,
    started: Vec<Started>,
    failures: Vec<LocalnetError>,
    named: Vec<Kind>,
    elapsed: Duration,
    algod: Option<algod_devnet::RunningDevnet>,
    stripe: Option<stripe_emulator::RunningEmulator>,
    nwc: Option<nwc_devnet::Devnet>,
    x402: Option<NodeLocalnet>,
}

impl std::fmt::Debug for Localnets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The variables hold keys and connection secrets (dev ones, still): names only.
        f.debug_struct("Localnets")
            .field("started", &self.started)
            .field("failures", &self.failures)
            .field("named", &self.named)
            .finish_non_exhaustive()
    }
}

impl Localnets {
    /// Starts, side by side, each localnet of `opts.kinds` that the environment does not name,
    /// and waits until each is ready (or has failed: see [`Localnets::failures`]). Must run on a
    /// Tokio runtime that outlives the returned value: the in-process servers are its tasks.
    pub async fn start(opts: &Options) -> Localnets {
        let t0 = Instant::now();
        let mut nets = Localnets::default();
        let mut want = |k: Kind| {
            if !opts.kinds.contains(&k) {
                false
            } else if k.named_by_env() {
                nets.named.push(k);
                false
            } else {
                true
            }
        };
        let (a, s, n, x) = (
            want(Kind::Algod),
            want(Kind::Stripe),
            want(Kind::Nwc),
            want(Kind::X402),
        );
        let (algod, stripe, nwc, x402) = tokio::join!(
            async { if a { Some(start_algod().await) } else { None } },
            async { if s { Some(start_stripe().await) } else { None } },
            async { if n { Some(start_nwc().await) } else { None } },
            Box::pin(async {
                if x {
                    Some(NodeLocalnet::start(&opts.repo).await)
                } else {
                    None
                }
            }),
        );
        match algod {
            Some(Ok((running, vars))) => {
                nets.record(Kind::Algod, running.url.clone(), vars);
                nets.algod = Some(running);
            }
            Some(Err(e)) => nets.failures.push(e),
            None => {}
        }
        match stripe {
            Some(Ok(running)) => {
                let url = running.url.clone();
                nets.record(
                    Kind::Stripe,
                    url.clone(),
                    vec![("STRIPE_EMULATOR_URL".into(), url)],
                );
                nets.stripe = Some(running);
            }
            Some(Err(e)) => nets.failures.push(e),
            None => {}
        }
        match nwc {
            Some(Ok((devnet, vars))) => {
                nets.record(Kind::Nwc, devnet.relay_url().to_owned(), vars);
                nets.nwc = Some(devnet);
            }
            Some(Err(e)) => nets.failures.push(e),
            None => {}
        }
        match x402 {
            Some(Ok((node, vars))) => {
                let url = vars
                    .iter()
                    .find(|(k, _)| k == "X402_RPC_URL")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                nets.record(Kind::X402, url, vars);
                nets.x402 = Some(node);
            }
            Some(Err(e)) => nets.failures.push(e),
            None => {}
        }
        nets.elapsed = t0.elapsed();
        nets
    }

    fn record(&mut self, kind: Kind, url: String, vars: Vec<(String, String)>) {
        self.started.push(Started { kind, url });
        self.vars.extend(vars);
    }

    /// The variables of the localnets that were started, `(NAME, value)`, to set on the
    /// environment of whatever uses them.
    #[must_use]
    pub fn vars(&self) -> &[(String, String)] {
        &self.vars
    }

    /// The variables as `export NAME='value'` lines, for a shell to source.
    #[must_use]
    pub fn env_text(&self) -> String {
        self.vars
            .iter()
            .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
            .collect()
    }

    /// The localnets that were started.
    #[must_use]
    pub fn started(&self) -> &[Started] {
        &self.started
    }

    /// The localnets that could not start.
    #[must_use]
    pub fn failures(&self) -> &[LocalnetError] {
        &self.failures
    }

    /// The wanted localnets that were not started because the environment names one.
    #[must_use]
    pub fn named_by_env(&self) -> &[Kind] {
        &self.named
    }

    /// How long starting took.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// A few lines for people: what was started where, what the environment already named,
    /// what failed.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for s in &self.started {
            out.push_str(&format!("localnet: {} at {}\n", s.kind, s.url));
        }
        for k in &self.named {
            out.push_str(&format!(
                "localnet: {k} not started: {} names one\n",
                k.marker()
            ));
        }
        for e in &self.failures {
            out.push_str(&format!("localnet: {e}\n"));
        }
        if !self.started.is_empty() {
            out.push_str(&format!(
                "localnet: {} started in {:.1?}\n",
                self.started.len(),
                self.elapsed
            ));
        }
        out
    }

    /// Returns when a localnet that runs as a child process (the x402 one) has exited on its
    /// own, naming it; never, when none does.
    pub async fn exited(&mut self) -> Kind {
        match self.x402.as_mut() {
            Some(node) => {
                let _ = node.child.wait().await;
                Kind::X402
            }
            None => std::future::pending().await,
        }
    }

    /// Stops every localnet that was started: the x402 localnet (its process group: node and
    /// anvil) with SIGTERM, then SIGKILL after a grace period; the in-process servers at once.
    pub async fn stop(mut self) {
        if let Some(node) = self.x402.take() {
            node.stop().await;
        }
        if let Some(nwc) = self.nwc.take() {
            nwc.shutdown().await;
        }
        self.stripe = None;
        self.algod = None;
    }
}

/// The signals that stop the runner and its localnets in order: Ctrl-C (SIGINT), SIGTERM and
/// SIGHUP. Once made, they no longer end the process: they are for [`Signals::recv`] to take.
#[derive(Debug)]
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Takes over SIGINT, SIGTERM and SIGHUP (on a Tokio runtime).
    ///
    /// # Errors
    /// When a handler cannot be installed.
    pub fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for the next one and says which it was.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// `s` single-quoted for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The inverse of [`shell_quote`] for the `export NAME='value'` lines `localnet.mjs` writes
/// (also takes unquoted values).
fn parse_env_file(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("export ") else {
            continue;
        };
        let Some((name, raw)) = rest.split_once('=') else {
            continue;
        };
        let mut value = String::new();
        let mut quoted = false;
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\'' => quoted = !quoted,
                '\\' if !quoted => {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                }
                c => value.push(c),
            }
        }
        out.push((name.trim().to_owned(), value));
    }
    out
}

async fn start_algod() -> Result<(algod_devnet::RunningDevnet, Vec<(String, String)>), LocalnetError>
{
    use algod_devnet::{AssetConfig, Devnet, DevnetConfig, TESTNET_USDC};
    // A token and a faucet of this run's own: the faucet key goes only to the variables. The
    // faucet also holds the supply of USDC (testnet's ASA id), for exact-avm.
    let token = format!("devnet-{}", hex::encode(rand::random::<[u8; 8]>()));
    let seed: [u8; 32] = rand::random();
    let faucet = ed25519_dalek::SigningKey::from_bytes(&seed);
    let cfg = DevnetConfig {
        token: Some(token.clone()),
        accounts: vec![(
            rail_exact_algo::address::Address(faucet.verifying_key().to_bytes()),
            ALGOD_FAUCET_MICROALGOS,
        )],
        assets: vec![AssetConfig::usdc(rail_exact_algo::address::Address(
            faucet.verifying_key().to_bytes(),
        ))],
        ..DevnetConfig::default()
    };
    let running = Devnet::spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| LocalnetError::Start {
            kind: Kind::Algod,
            why: e.to_string(),
        })?;
    let vars = vec![
        ("ALGOD_URL".to_owned(), running.url.clone()),
        ("ALGOD_TOKEN".to_owned(), token),
        ("ALGOD_FAUCET_SEED".to_owned(), BASE64.encode(&seed)),
        ("ALGOD_USDC_ASSET".to_owned(), TESTNET_USDC.to_string()),
    ];
    Ok((running, vars))
}

async fn start_stripe() -> Result<stripe_emulator::RunningEmulator, LocalnetError> {
    use stripe_emulator::{Emulator, EmulatorConfig};
    // The default keys (`sk_test_emulator`) are the ones the harness and tests present.
    Emulator::spawn(
        EmulatorConfig::default(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .map_err(|e| LocalnetError::Start {
        kind: Kind::Stripe,
        why: e.to_string(),
    })
}

async fn start_nwc() -> Result<(nwc_devnet::Devnet, Vec<(String, String)>), LocalnetError> {
    use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
    let err = |e: nwc_devnet::DevnetError| LocalnetError::Start {
        kind: Kind::Nwc,
        why: e.to_string(),
    };
    let devnet = Devnet::start(DevnetConfig::default()).await.map_err(err)?;
    let mut vars = Vec::new();
    for (var, name, msat) in [
        ("NWC_PAYER_URI", "payer", NWC_PAYER_MSAT),
        ("NWC_PAYEE_URI", "payee", 0),
        ("NWC_OTHER_URI", "other", 0),
    ] {
        match devnet.create_wallet(WalletSpec::new(name, msat)).await {
            Ok(w) => vars.push((var.to_owned(), w.uri.to_string())),
            Err(e) => {
                devnet.shutdown().await;
                return Err(err(e));
            }
        }
    }
    Ok((devnet, vars))
}

/// `node scripts/x402/localnet.mjs`, in a process group of its own (node and its anvil).
struct NodeLocalnet {
    child: tokio::process::Child,
    /// The process group (node's pid), once spawned; `None` after it was signalled for good.
    group: Option<rustix::process::Pid>,
    /// Holds the env file and node's log while the localnet runs.
    _dir: tempfile::TempDir,
}

impl NodeLocalnet {
    async fn start(repo: &Path) -> Result<(NodeLocalnet, Vec<(String, String)>), LocalnetError> {
        let script = repo.join("scripts/x402/localnet.mjs");
        let install = repo.join("scripts/x402/install.sh");
        for path in [&script, &install] {
            if !path.is_file() {
                return Err(LocalnetError::NoScripts { path: path.clone() });
            }
        }
        for program in ["node", "npm"] {
            if !on_path(program) {
                return Err(LocalnetError::MissingProgram { program });
            }
        }
        // Idempotent: "up to date" in a few milliseconds once node_modules matches the lock.
        // Its progress goes to our stderr.
        let status = tokio::process::Command::new("bash")
            .arg(&install)
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .status()
            .await
            .map_err(|e| LocalnetError::Install { why: e.to_string() })?;
        if !status.success() {
            return Err(LocalnetError::Install {
                why: status.to_string(),
            });
        }

        let x402_err = |why: String| LocalnetError::X402 { why };
        let dir = tempfile::Builder::new()
            .prefix("stipendex-x402-localnet-")
            .tempdir()
            .map_err(|e| x402_err(format!("no temporary directory ({e})")))?;
        let env_path = dir.path().join("x402.env");
        let log_path = dir.path().join("localnet.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| x402_err(format!("cannot create its log ({e})")))?;
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .arg("--env-out")
            .arg(&env_path)
            .arg("--exit-with-parent")
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            // Its own process group: a terminal's Ctrl-C reaches us, not it (we stop it in
            // order), and one signal to the group reaches node and anvil together.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| x402_err(format!("node did not start ({e})")))?;
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .filter(|p| p.as_raw_nonzero().get() > 1);
        let stdout = child.stdout.take();
        let mut node = NodeLocalnet {
            child,
            group,
            _dir: dir,
        };
        let last_log_line = || {
            std::fs::read_to_string(&log_path)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "it logged nothing".into())
        };
        // It prints one line, `X402_LOCALNET {json}`, once the token is deployed, verified and
        // the env file written.
        let ready = async {
            let Some(stdout) = stdout else {
                return false;
            };
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("X402_LOCALNET ") {
                    return true;
                }
            }
            false
        };
        match tokio::time::timeout(X402_READY_TIMEOUT, ready).await {
            Ok(true) => {}
            Ok(false) => {
                let status = node.child.wait().await;
                let how = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                node.stop().await;
                return Err(x402_err(format!(
                    "it exited ({how}) with \"{}\"",
                    last_log_line()
                )));
            }
            Err(_) => {
                node.stop().await;
                return Err(x402_err(format!(
                    "it was not ready after {X402_READY_TIMEOUT:?}, last saying \"{}\"",
                    last_log_line()
                )));
            }
        }
        let vars = match std::fs::read_to_string(&env_path) {
            Ok(text) => parse_env_file(&text),
            Err(e) => {
                node.stop().await;
                return Err(x402_err(format!("its env file is unreadable ({e})")));
            }
        };
        if !vars.iter().any(|(k, _)| k == "X402_RPC_URL") {
            node.stop().await;
            return Err(x402_err("its env file has no X402_RPC_URL".into()));
        }
        Ok((node, vars))
    }

    fn signal_group(&self, sig: rustix::process::Signal) -> bool {
        self.group
            .is_some_and(|g| rustix::process::kill_process_group(g, sig).is_ok())
    }

    fn group_alive(&self) -> bool {
        self.group
            .is_some_and(|g| rustix::process::test_kill_process_group(g).is_ok())
    }

    /// SIGTERM to the group (node stops anvil; anvil also gets it), SIGKILL after a grace
    /// period, until no process of the group is left.
    async fn stop(mut self) {
        use rustix::process::Signal;
        self.signal_group(Signal::TERM);
        if tokio::time::timeout(X402_STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            self.signal_group(Signal::KILL);
            let _ = self.child.wait().await;
        }
        // node has exited; its anvil may take a moment longer.
        let until = Instant::now() + X402_STOP_GRACE;
        while self.group_alive() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.signal_group(Signal::KILL);
        self.group = None;
    }
}

impl Drop for NodeLocalnet {
    fn drop(&mut self) {
        // Not stopped in order (an early return, a panic): end the group now. node would
        // leave anvil behind on the SIGKILL that `kill_on_drop` sends it.
        self.signal_group(rustix::process::Signal::TERM);
    }
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_round_trip() {
        let vars = vec![
            ("A".to_owned(), "plain".to_owned()),
            ("B".to_owned(), "it's a 'quote' & more".to_owned()),
            (
                "C".to_owned(),
                "nostr+walletconnect://ab?relay=ws://127.0.0.1:1&secret=cd".to_owned(),
            ),
        ];
        let nets = Localnets {
            vars: vars.clone(),
            ..Localnets::default()
        };
        let text = nets.env_text();
        assert_eq!(parse_env_file(&format!("# comment\n{text}")), vars);
    }

    #[test]
    fn rails_map_to_their_localnets() {
        assert_eq!(Kind::for_rail("exact-algo"), Some(Kind::Algod));
        assert_eq!(Kind::for_rail("x402"), Some(Kind::X402));
        // The ledger and the hosted facilitator (served in process) need PostgreSQL only.
        let postgres_only = ["ledger", "account"];
        for rail in postgres_only {
            assert_eq!(Kind::for_rail(rail), None);
        }
        for rail in crate::rails::all() {
            let k = Kind::for_rail(rail.name);
            assert!(
                postgres_only.contains(&rail.name) || k.is_some(),
                "{}",
                rail.name
            );
        }
    }

    #[tokio::test]
    async fn in_process_localnets_start_answer_and_stop() {
        let nets =
            Localnets::start(&Options::new(vec![Kind::Algod, Kind::Stripe, Kind::Nwc])).await;
        assert!(nets.failures().is_empty(), "{nets:?}");
        for s in nets.started() {
            assert!(s.url.starts_with("http://") || s.url.starts_with("ws://"));
        }
        let var = |k: &str| {
            nets.vars()
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        if !Kind::Algod.named_by_env() {
            let url = var("ALGOD_URL").expect("ALGOD_URL");
            let health = reqwest::get(format!("{url}/health")).await.expect("health");
            assert!(health.status().is_success());
            assert!(var("ALGOD_FAUCET_SEED").is_some() && var("ALGOD_TOKEN").is_some());
        }
        if !Kind::Nwc.named_by_env() {
            for k in ["NWC_PAYER_URI", "NWC_PAYEE_URI", "NWC_OTHER_URI"] {
                assert!(var(k).is_some_and(|v| v.starts_with("nostr+walletconnect://")));
            }
        }
        nets.stop().await;
    }
}
