//! Relay plumbing for a request/response protocol over Nostr (NIP-47 here; ContextVM can use
//! it as it is), on nostr-sdk 0.44, with its two workarounds:
//! - after a reconnect, nostr-relay-pool 0.44 may skip re-sending a subscription (its check
//!   compares unix *seconds*): [`keep_subscribed`] re-sends it every time a relay reports
//!   `Connected`, and again while the relay has not confirmed it (EOSE);
//! - `send_event` returns `Ok` even when no relay accepted the event: [`publish`] checks
//!   `success` and republishes the same event (same id) until a relay accepts it, the answer
//!   arrives, or the deadline passes — a send no relay accepted is an error, never a success.
//!
//! - NIP-47's (and ContextVM's) requests and answers are ephemeral events: a relay passes each
//!   to the subscriptions it has at that instant and stores none. An answer that arrives before
//!   the asker's subscription is live on the relay's current connection is lost for good, so
//!   [`keep_subscribed`] tracks which relays confirmed it (EOSE) on their current connection
//!   ([`Listening`]) and a request waits for one ([`Listening::wait_live`]) before it is sent.
//!
//! `who` names the protocol in the logs.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use nostr_sdk::pool::RelayNotification;
use nostr_sdk::{
    Client, Event, Filter, PublicKey, Relay, RelayMessage, RelayPoolNotification, RelayStatus,
    RelayUrl, SubscribeOptions, SubscriptionId,
};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, broadcast, oneshot};
use tokio::time::Instant;

/// Which relays have confirmed a subscription (its EOSE) on their current connection: the
/// relays an answer to a request sent now can come back through. Kept by [`keep_subscribed`].
#[derive(Debug, Default)]
pub struct Listening {
    live: Mutex<HashSet<RelayUrl>>,
    changed: Notify,
}

impl Listening {
    /// Whether at least one relay has the subscription live.
    #[must_use]
    pub fn is_live(&self) -> bool {
        !self.live().is_empty()
    }

    /// Waits until at least one relay has the subscription live; `false` at `deadline`.
    pub async fn wait_live(&self, deadline: Instant) -> bool {
        loop {
            let changed = self.changed.notified();
            if self.is_live() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.is_live();
            }
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashSet<RelayUrl>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, url: &RelayUrl, live: bool) {
        let changed = if live {
            self.live().insert(url.clone())
        } else {
            self.live().remove(url)
        };
        if changed {
            self.changed.notify_waiters();
        }
    }
}

/// How long a subscription sent on a live connection waits for the relay's EOSE before it is
/// sent again (same id, which replaces it on the relay).
const CONFIRM_WITHIN: Duration = Duration::from_secs(2);

/// Re-sends the subscription every time `relay` (re)connects — works around nostr-relay-pool
/// 0.44 skipping the resubscription when the reconnect lands in the same second — and keeps
/// `listening` true for `relay` from the subscription's EOSE on a connection to that
/// connection's end (or a `CLOSED` for it, which is answered with the subscription again).
/// A subscription the relay has not confirmed within [`CONFIRM_WITHIN`] while it stays
/// connected — one that failed to go out, or that a relay coming back under load never
/// answered — is sent again until it is: otherwise this side stays deaf until the next
/// reconnect.
pub async fn keep_subscribed(
    who: &'static str,
    relay: Relay,
    mut rx: broadcast::Receiver<RelayNotification>,
    id: SubscriptionId,
    filter: Filter,
    listening: std::sync::Arc<Listening>,
) {
    // Sends the subscription; the time by which its EOSE is due.
    let subscribe = || async {
        match relay
            .subscribe_with_id(id.clone(), filter.clone(), SubscribeOptions::default())
            .await
        {
            Ok(()) => tracing::debug!(relay = %relay.url(), %who, "(re)subscribed"),
            Err(e) => {
                tracing::warn!(relay = %relay.url(), %who, error = %e, "resubscribe failed");
            }
        }
        Some(Instant::now() + CONFIRM_WITHIN)
    };
    let mut confirm_by: Option<Instant> = None;
    loop {
        let next = match confirm_by {
            Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                Ok(next) => next,
                Err(_) => {
                    // Unconfirmed: sent again while connected; a relay that dropped is
                    // subscribed again at its next `Connected`.
                    confirm_by = None;
                    if relay.is_connected() {
                        tracing::debug!(relay = %relay.url(), %who, "subscription unconfirmed: sent again");
                        confirm_by = subscribe().await;
                    }
                    continue;
                }
            },
            None => rx.recv().await,
        };
        match next {
            Ok(RelayNotification::RelayStatus {
                status: RelayStatus::Connected,
            }) => {
                // A new connection: live again only once the relay confirms the subscription.
                listening.set(relay.url(), false);
                confirm_by = subscribe().await;
            }
            Ok(RelayNotification::RelayStatus { status }) => {
                listening.set(relay.url(), false);
                tracing::debug!(relay = %relay.url(), %who, %status, "relay status");
            }
            Ok(RelayNotification::Message { message }) => match message {
                RelayMessage::EndOfStoredEvents(sid) if *sid == id => {
                    listening.set(relay.url(), true);
                    confirm_by = None;
                }
                RelayMessage::Closed {
                    subscription_id, ..
                } if *subscription_id == id => {
                    listening.set(relay.url(), false);
                    confirm_by = subscribe().await;
                }
                _ => {}
            },
            Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => {
                listening.set(relay.url(), false);
                break;
            }
            Err(RecvError::Lagged(_)) => {
                // A status or an EOSE may be among what was missed: ask for a fresh EOSE.
                confirm_by = subscribe().await;
            }
            Ok(_) => {}
        }
    }
}

/// How many of `relays` are connected.
#[must_use]
pub fn connected(relays: &[Relay]) -> usize {
    relays.iter().filter(|r| r.is_connected()).count()
}

/// Waits until every relay is connected, or one is and the others had `grace`; `false` when
/// none is by `deadline`.
pub async fn wait_connected(
    relays: &[Relay],
    deadline: Instant,
    grace: Duration,
    who: &'static str,
) -> bool {
    let mut first: Option<Instant> = None;
    loop {
        let n = connected(relays);
        let now = Instant::now();
        if n == relays.len() {
            return true;
        }
        if n > 0 {
            let since = *first.get_or_insert(now);
            if now.duration_since(since) >= grace || now >= deadline {
                tracing::warn!(
                    connected = n,
                    total = relays.len(),
                    %who,
                    "going on without every relay"
                );
                return true;
            }
        } else if now >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads pool messages for the subscription `id` until every connected relay sent EOSE, or
/// the deadline. Returns the events of that subscription (signed by `author`) and the number
/// of relays that sent EOSE.
pub async fn collect_until_eose(
    rx: &mut broadcast::Receiver<RelayPoolNotification>,
    relays: &[Relay],
    id: &SubscriptionId,
    author: &PublicKey,
    deadline: Instant,
    stop_on_event_after_eose: bool,
) -> (Vec<Event>, usize) {
    let mut eose: HashSet<RelayUrl> = HashSet::new();
    let mut events: Vec<Event> = Vec::new();
    loop {
        let all_eose = !eose.is_empty()
            && relays
                .iter()
                .filter(|r| r.is_connected())
                .all(|r| eose.contains(r.url()));
        if all_eose && (!stop_on_event_after_eose || !events.is_empty()) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let tick = (now + Duration::from_millis(50)).min(deadline);
        match tokio::time::timeout_at(tick, rx.recv()).await {
            Ok(Ok(RelayPoolNotification::Message { relay_url, message })) => match message {
                RelayMessage::EndOfStoredEvents(sid) if *sid == *id => {
                    eose.insert(relay_url);
                }
                RelayMessage::Event {
                    subscription_id,
                    event,
                } if *subscription_id == *id
                    && event.pubkey == *author
                    && event.verify().is_ok() =>
                {
                    events.push(event.into_owned());
                }
                _ => {}
            },
            Ok(Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed)) => break,
            Ok(Ok(RelayPoolNotification::Event { .. }) | Err(RecvError::Lagged(_))) | Err(_) => {}
        }
    }
    (events, eose.len())
}

/// How [`publish`] ended.
#[derive(Debug)]
pub enum Published {
    /// The answer arrived (possibly while the request was still being republished).
    Answered(Event),
    /// A relay accepted the request; its answer is still to come.
    Accepted,
    /// No relay accepted it by the deadline: what the relays said.
    NotAccepted(String),
    /// The answer's sender was dropped (the client shut down).
    Closed,
}

/// Sends `ev` through `client` once, raced against the answer on `answer` (a slow relay's
/// `OK` does not hold back an answer that has come): `Accepted` when a relay took it,
/// `NotAccepted` with what the relays said (or that none answered by `deadline`).
pub async fn send_once(
    client: &Client,
    ev: &Event,
    answer: &mut oneshot::Receiver<Event>,
    deadline: Instant,
) -> Published {
    tokio::select! {
        r = &mut *answer => r.map_or(Published::Closed, Published::Answered),
        sent = tokio::time::timeout_at(deadline, client.send_event(ev)) => match sent {
            Err(_) => Published::NotAccepted("no relay answered in time".into()),
            Ok(Ok(out)) if !out.success.is_empty() => Published::Accepted,
            Ok(Ok(out)) => Published::NotAccepted(
                out.failed
                    .iter()
                    .map(|(u, why)| format!("{u}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            Ok(Err(e)) => Published::NotAccepted(e.to_string()),
        },
    }
}

/// Sends `ev` through `client` until a relay accepts it, pausing `retry` between attempts; the
/// answer on `answer` ends it at once (the pool may deliver a queued request meanwhile).
pub async fn publish(
    client: &Client,
    ev: &Event,
    answer: &mut oneshot::Receiver<Event>,
    deadline: Instant,
    retry: Duration,
    who: &'static str,
) -> Published {
    let mut failure = String::from("no relay");
    while Instant::now() < deadline {
        match send_once(client, ev, answer, deadline).await {
            Published::NotAccepted(why) => failure = why,
            done => return done,
        }
        tracing::debug!(id = %ev.id, %who, %failure, "no relay accepted the event; retrying");
        let pause = (Instant::now() + retry).min(deadline);
        tokio::select! {
            r = &mut *answer => return r.map_or(Published::Closed, Published::Answered),
            () = tokio::time::sleep_until(pause) => {}
        }
    }
    Published::NotAccepted(failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waits_for_a_live_subscription() {
        let l = std::sync::Arc::new(Listening::default());
        let soon = Instant::now() + Duration::from_millis(30);
        assert!(!l.wait_live(soon).await, "nothing confirmed: not live");

        let url = RelayUrl::parse("ws://127.0.0.1:7777").unwrap_or_else(|e| panic!("{e}"));
        let (l2, u2) = (l.clone(), url.clone());
        let confirm = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            l2.set(&u2, true);
        });
        assert!(l.wait_live(Instant::now() + Duration::from_secs(5)).await);
        confirm.await.unwrap_or_else(|e| panic!("{e}"));

        // The connection ends: not live until the next EOSE.
        l.set(&url, false);
        assert!(!l.is_live());
    }
}
