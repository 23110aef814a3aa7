//! The relays a ContextVM peer talks through: one nostr-sdk client signing as the peer's key
//! (so a relay that asks for NIP-42 authentication is answered), one subscription kept across
//! reconnects, and a publish that is an error when no relay accepted the event — both from
//! [`rail_ln_nwc::relays`], the plumbing NIP-47 uses, never a copy.
//!
//! Everything a relay sends is hostile until checked: the inbox only de-duplicates and bounds
//! what it passes on; signatures, kinds and recipients are checked by [`super::wire`].

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use nostr_sdk::{
    Client, Event, EventId, Filter, Keys, Relay, RelayOptions, RelayPoolNotification, RelayUrl,
    SubscriptionId,
};
use rail_ln_nwc::relays::{
    Listening, Published, collect_until_eose, keep_subscribed, publish, wait_connected,
};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::Error;

/// How many event ids the inbox remembers to drop a duplicate (several relays, a relay's
/// resend after a reconnect); the SDK keeps 5 000 (`docs/research/contextvm-sdk-0.11.14.md` §4).
const SEEN_IDS: usize = 8192;
/// How many events may wait in the inbox; beyond it a flood is dropped (logged), never
/// buffered without bound.
const INBOX: usize = 4096;
/// How long `connect` waits for the other relays once one is connected.
const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// How to reach the relays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelaySettings {
    /// Bound on connecting, and on publishing one event (republished until a relay accepts it
    /// or this passes). Default 10 s.
    pub timeout: Duration,
    /// Reconnection interval, and the pause between publishing attempts. Default 300 ms.
    pub retry: Duration,
}

impl Default for RelaySettings {
    fn default() -> Self {
        RelaySettings {
            timeout: Duration::from_secs(10),
            retry: Duration::from_millis(300),
        }
    }
}

/// A connected set of relays with one live subscription.
pub struct Relays {
    client: Client,
    relays: Vec<Relay>,
    tasks: Vec<AbortHandle>,
    opts: RelaySettings,
    /// Which relays carry the subscription on their current connection.
    listening: Arc<Listening>,
}

impl std::fmt::Debug for Relays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relays")
            .field(
                "relays",
                &self
                    .relays
                    .iter()
                    .map(|r| r.url().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

fn relay_err(e: impl std::fmt::Display) -> Error {
    Error::Relay(e.to_string())
}

impl Relays {
    /// Connects to `urls` as `keys`, subscribes to `filter` (waiting until a relay confirms it
    /// with EOSE) and returns the inbox of the subscription's events, each once.
    ///
    /// # Errors
    /// [`Error::Relay`] for a URL that is not a relay's, or when no relay is reachable or
    /// confirms the subscription in time.
    pub async fn connect(
        keys: &Keys,
        urls: &[String],
        filter: Filter,
        opts: RelaySettings,
    ) -> Result<(Relays, mpsc::Receiver<Event>), Error> {
        if urls.is_empty() {
            return Err(Error::Relay("no relay given".into()));
        }
        let client = Client::builder().signer(keys.clone()).build();
        let relay_opts = RelayOptions::new()
            .retry_interval(opts.retry)
            .adjust_retry_interval(false);
        let mut relays = Vec::with_capacity(urls.len());
        for u in urls {
            let url = RelayUrl::parse(u).map_err(|e| Error::Relay(format!("{u}: {e}")))?;
            client
                .pool()
                .add_relay(url.clone(), relay_opts.clone())
                .await
                .map_err(relay_err)?;
            relays.push(client.relay(url).await.map_err(relay_err)?);
        }
        let sub = SubscriptionId::generate();
        let (tx, inbox) = mpsc::channel(INBOX);
        let mut messages = client.notifications();
        let mut tasks =
            vec![tokio::spawn(read(client.notifications(), sub.clone(), tx)).abort_handle()];
        let listening = Arc::new(Listening::default());
        for relay in &relays {
            tasks.push(
                tokio::spawn(keep_subscribed(
                    "contextvm",
                    relay.clone(),
                    relay.notifications(),
                    sub.clone(),
                    filter.clone(),
                    listening.clone(),
                ))
                .abort_handle(),
            );
        }
        let this = Relays {
            client,
            relays,
            tasks,
            opts,
            listening,
        };
        let deadline = Instant::now() + this.opts.timeout;
        this.client.connect().await;
        let started = async {
            if !wait_connected(&this.relays, deadline, CONNECT_GRACE, "contextvm").await {
                return Err(Error::Relay("no relay is reachable".into()));
            }
            this.client
                .subscribe_with_id(sub.clone(), filter, None)
                .await
                .map_err(relay_err)?;
            let nobody = Keys::generate().public_key();
            let (_, eose) =
                collect_until_eose(&mut messages, &this.relays, &sub, &nobody, deadline, false)
                    .await;
            if eose == 0 {
                return Err(Error::Relay(
                    "no relay confirmed the subscription (EOSE)".into(),
                ));
            }
            Ok(())
        };
        match started.await {
            Ok(()) => Ok((this, inbox)),
            Err(e) => {
                this.shutdown().await;
                Err(e)
            }
        }
    }

    /// Publishes `ev` once a relay carries this side's subscription (ContextVM's messages are
    /// ephemeral: an answer to `ev` that comes back before the subscription is live again
    /// after a reconnect is lost for good), republishing the same event until a relay accepts
    /// it.
    ///
    /// # Errors
    /// [`Error::Relay`] when no relay carries the subscription or accepted `ev` within the
    /// timeout.
    pub async fn publish(&self, ev: &Event) -> Result<(), Error> {
        let (_keep, mut never) = oneshot::channel::<Event>();
        let deadline = Instant::now() + self.opts.timeout;
        if !self.listening.wait_live(deadline).await {
            return Err(Error::Relay(format!(
                "no relay carries this side's subscription, so event {} was not sent",
                ev.id
            )));
        }
        match publish(
            &self.client,
            ev,
            &mut never,
            deadline,
            self.opts.retry,
            "contextvm",
        )
        .await
        {
            Published::Accepted | Published::Answered(_) => Ok(()),
            Published::NotAccepted(why) => Err(Error::Relay(format!(
                "no relay accepted event {}: {why}",
                ev.id
            ))),
            Published::Closed => Err(Error::Relay("shut down".into())),
        }
    }

    /// Disconnects and stops the background tasks.
    pub async fn shutdown(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.client.shutdown().await;
    }
}

/// The last `cap` event ids seen, to take each event once.
#[derive(Debug)]
pub(crate) struct SeenIds {
    ids: HashSet<EventId>,
    order: VecDeque<EventId>,
    cap: usize,
}

impl SeenIds {
    pub(crate) fn new(cap: usize) -> Self {
        SeenIds {
            ids: HashSet::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    /// Records `id`; `false` if it was seen already.
    pub(crate) fn first_time(&mut self, id: EventId) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > self.cap
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        true
    }
}

/// Passes each event of subscription `sub` once to `tx`.
async fn read(
    mut rx: tokio::sync::broadcast::Receiver<RelayPoolNotification>,
    sub: SubscriptionId,
    tx: mpsc::Sender<Event>,
) {
    let mut seen = SeenIds::new(SEEN_IDS);
    loop {
        match rx.recv().await {
            Ok(RelayPoolNotification::Event {
                subscription_id,
                event,
                ..
            }) if subscription_id == sub => {
                if !seen.first_time(event.id) {
                    continue;
                }
                match tx.try_send(*event) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(ev)) => {
                        tracing::warn!(id = %ev.id, "contextvm: inbox full; event dropped");
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
            Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => break,
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "contextvm: relay notifications lagged");
            }
            Ok(_) => {}
        }
    }
}
