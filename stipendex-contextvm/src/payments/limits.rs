//! What one client — or a crowd of throwaway keys, since a Nostr key costs nothing — can make
//! a CEP-8 server hold and make: the pending payments ([`Table`]) and the payment requests
//! made per unit of time ([`Rates`]).
//!
//! **Pending payments** are one bounded table (at most `max` entries, at most `per_client`
//! unpaid ones per client key). Slots are freed early: an unpaid payment whose client asks for
//! the same invocation again is replaced by the new one; expired ones are swept; and when the
//! table is full, a newcomer takes the slot of the oldest unpaid payment of the client with the
//! most unpaid payments — never a paid one (a transparent request being forwarded, an explicit
//! gating authorization not yet claimed). A full table therefore never locks a newcomer out:
//! it makes the crowd's entries turn over.
//!
//! **Payment requests** are rate-limited per client key (the receiver's costly-offer limit, as
//! HTTP Quotes with Lightning or Stripe offers are) and for the whole server (a token bucket).
//! The server-wide rate is what makes the turnover slow: every entry that replaces another
//! needed a payment request, so an unpaid payment is withdrawn only after at least
//! `(max - burst) / rate` further requests' time — about 90 s with the defaults (1 000
//! entries, 100 at once, 10 a second), long enough to pay an invoice. A crowd that asks faster
//! than the server-wide rate is refused with a time to retry, as every newcomer then is: that
//! is the wallet's protection (the shop's wallet never makes more invoices than the rate),
//! and each refused request costs the server no invoice and no slot.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use nostr::PublicKey;
use tokio::sync::watch;
use tokio::time::Instant;

use super::deadline::Deadline;

/// How long past its deadline an entry whose admission never finished (a task that stalled)
/// is swept anyway.
const STALE_GRACE: Duration = Duration::from_secs(60);
/// The most per-client windows of the costly-offer limit kept, whatever the rates configured.
const MAX_WINDOWS: usize = 65_536;

/// Where an entry of the [`Table`] is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A payment request was (or is being) made; its payment is awaited. The only stage a
    /// newcomer may take the slot of.
    Unpaid,
    /// Paid; the request is being forwarded (transparent lifecycle).
    Paid,
    /// Paid; one repeat of the invocation may run until `until` (explicit gating).
    Granted,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    client: PublicKey,
    identity: [u8; 32],
    stage: Stage,
    /// Unpaid or paid: the payment's deadline; granted: the end of the authorization.
    until: Instant,
    /// Set to `true` when the slot is taken away: the admission stops waiting.
    release: watch::Sender<bool>,
}

impl Entry {
    fn withdraw(&self) {
        // A closed receiver means the admission is gone already: nothing to tell.
        let _ = self.release.send(true);
    }
}

/// Why a slot was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The client holds its share of unpaid payments already.
    ClientFull,
    /// Every slot holds a paid payment: none may be taken.
    Full,
}

/// A slot given by [`Table::reserve`].
#[derive(Debug)]
pub(crate) struct Reserved {
    /// The entry's number (its age: smaller is older).
    pub(crate) seq: u64,
    /// When its payment stops being waited for.
    pub(crate) deadline: Deadline,
    /// How many unpaid entries were withdrawn to make room (replaced or evicted).
    pub(crate) withdrawn: usize,
}

/// The pending payments of a server (see the module's documentation). At most `max` entries,
/// whatever the clients send.
#[derive(Debug)]
pub(crate) struct Table {
    entries: Vec<Entry>,
    next: u64,
    max: usize,
    per_client: usize,
}

impl Table {
    pub(crate) fn new(max: usize, per_client: usize) -> Self {
        Table {
            entries: Vec::new(),
            next: 0,
            max: max.max(1),
            per_client: per_client.max(1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many entries `client` holds (any stage).
    pub(crate) fn len_of(&self, client: &PublicKey) -> usize {
        self.entries.iter().filter(|e| e.client == *client).count()
    }

    fn unpaid_of(&self, client: &PublicKey) -> usize {
        self.entries
            .iter()
            .filter(|e| e.client == *client && e.stage == Stage::Unpaid)
            .count()
    }

    fn unpaid_for(&self, identity: &[u8; 32]) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.identity == *identity && e.stage == Stage::Unpaid)
    }

    fn remove_at(&mut self, i: usize) -> Entry {
        self.entries.swap_remove(i)
    }

    /// Drops granted authorizations past their end and unpaid or paid entries long past their
    /// deadline (their admission stalled; it is told to stop waiting).
    pub(crate) fn sweep(&mut self, now: Instant) {
        self.entries.retain(|e| {
            let keep = match e.stage {
                Stage::Granted => e.until > now,
                Stage::Unpaid | Stage::Paid => e.until + STALE_GRACE > now,
            };
            if !keep {
                e.withdraw();
            }
            keep
        });
    }

    /// Whether `client` may have another unpaid payment for `identity` (one for the same
    /// invocation would be replaced, so it does not count), before anything is spent on it.
    pub(crate) fn admits(&self, client: &PublicKey, identity: &[u8; 32]) -> Result<(), Refused> {
        let replaced = usize::from(self.unpaid_for(identity).is_some());
        if self.unpaid_of(client).saturating_sub(replaced) >= self.per_client {
            return Err(Refused::ClientFull);
        }
        Ok(())
    }

    /// The stage of the most advanced entry for `identity` (granted first), if any.
    pub(crate) fn stage_of(&self, identity: &[u8; 32]) -> Option<Stage> {
        let mut found = None;
        for e in self.entries.iter().filter(|e| e.identity == *identity) {
            match e.stage {
                Stage::Granted => return Some(Stage::Granted),
                s => found = Some(s),
            }
        }
        found
    }

    /// Takes the granted authorization for `identity` (one payment, one run): `true` if there
    /// was one.
    pub(crate) fn claim(&mut self, identity: &[u8; 32], now: Instant) -> bool {
        let found = self
            .entries
            .iter()
            .position(|e| e.identity == *identity && e.stage == Stage::Granted && e.until > now);
        match found {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// A slot for an unpaid payment of `client` for `identity`, awaited until `until`: the
    /// client's unpaid payment for the same invocation is replaced; when the table is full, the
    /// oldest unpaid payment of the client with the most unpaid payments is withdrawn (never a
    /// paid one).
    ///
    /// # Errors
    /// [`Refused::ClientFull`] when the client holds its share; [`Refused::Full`] when every
    /// slot holds a paid payment.
    pub(crate) fn reserve(
        &mut self,
        client: PublicKey,
        identity: [u8; 32],
        until: Instant,
        now: Instant,
    ) -> Result<Reserved, Refused> {
        self.sweep(now);
        self.admits(&client, &identity)?;
        let mut withdrawn = 0;
        if let Some(i) = self.unpaid_for(&identity) {
            self.remove_at(i).withdraw();
            withdrawn += 1;
        }
        if self.entries.len() >= self.max {
            let Some(i) = self.victim() else {
                return Err(Refused::Full);
            };
            let victim = self.remove_at(i);
            tracing::info!(
                client = %victim.client,
                "contextvm payments: full; the oldest unpaid payment of the client with the most is withdrawn"
            );
            victim.withdraw();
            withdrawn += 1;
        }
        let seq = self.next;
        self.next = self.next.wrapping_add(1);
        let (release, released) = watch::channel(false);
        self.entries.push(Entry {
            seq,
            client,
            identity,
            stage: Stage::Unpaid,
            until,
            release,
        });
        Ok(Reserved {
            seq,
            deadline: Deadline::new(until, released),
            withdrawn,
        })
    }

    /// The entry a newcomer takes the place of: the oldest unpaid entry of the client with the
    /// most unpaid entries.
    fn victim(&self) -> Option<usize> {
        // (unpaid entries, the index of its oldest) per client; at most `max` clients.
        let mut per: HashMap<PublicKey, (usize, usize)> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if e.stage != Stage::Unpaid {
                continue;
            }
            let slot = per.entry(e.client).or_insert((0, i));
            slot.0 += 1;
            if self.entries.get(slot.1).is_some_and(|o| o.seq > e.seq) {
                slot.1 = i;
            }
        }
        per.values()
            .max_by(|a, b| {
                let seq = |i: usize| self.entries.get(i).map_or(u64::MAX, |e| e.seq);
                // More unpaid first; among equals, the older (smaller seq) wins.
                a.0.cmp(&b.0).then_with(|| seq(b.1).cmp(&seq(a.1)))
            })
            .map(|&(_, i)| i)
    }

    fn position(&self, seq: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.seq == seq)
    }

    /// Entry `seq` was paid: it is no longer a payment anyone may take the place of.
    pub(crate) fn paid(&mut self, seq: u64) {
        if let Some(i) = self.position(seq)
            && let Some(e) = self.entries.get_mut(i)
        {
            e.stage = Stage::Paid;
        }
    }

    /// Entry `seq` was paid and authorizes one run of its invocation until `until` (explicit
    /// gating); kept after its admission ends, until claimed or swept. An entry withdrawn
    /// meanwhile (its payment was seen as it went) comes back: it takes the place of an unpaid
    /// one if the table is full, and is kept beyond the cap only when none is unpaid — each
    /// such entry is a payment made.
    pub(crate) fn grant(
        &mut self,
        seq: u64,
        client: PublicKey,
        identity: [u8; 32],
        until: Instant,
    ) {
        if let Some(e) = self.position(seq).and_then(|i| self.entries.get_mut(i)) {
            e.stage = Stage::Granted;
            e.until = until;
            return;
        }
        tracing::info!(%client, "contextvm payments: a withdrawn payment request was paid; its authorization is kept");
        if self.entries.len() >= self.max
            && let Some(i) = self.victim()
        {
            self.remove_at(i).withdraw();
        }
        let (release, _) = watch::channel(false);
        self.entries.push(Entry {
            seq,
            client,
            identity,
            stage: Stage::Granted,
            until,
            release,
        });
    }

    /// Entry `seq`'s admission ended: it goes, unless it is a granted authorization.
    pub(crate) fn finish(&mut self, seq: u64) {
        if let Some(i) = self.position(seq)
            && self
                .entries
                .get(i)
                .is_some_and(|e| e.stage != Stage::Granted)
        {
            self.remove_at(i);
        }
    }
}

/// A token bucket (GCRA): up to `burst` at once, one more every `interval`.
#[derive(Debug)]
struct Bucket {
    interval: Duration,
    tolerance: Duration,
    /// The theoretical arrival time of the next request.
    tat: Option<Instant>,
}

impl Bucket {
    fn new(max: u32, per: Duration) -> Self {
        let max = max.max(1);
        let interval = (per / max).max(Duration::from_nanos(1));
        Bucket {
            interval,
            tolerance: interval.saturating_mul(max - 1),
            tat: None,
        }
    }

    /// Counts one at `now`: `Err(wait)` when none is left now.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let tat = self.tat.map_or(now, |t| t.max(now));
        let ahead = tat.saturating_duration_since(now);
        if ahead > self.tolerance {
            return Err(ahead - self.tolerance);
        }
        self.tat = Some(tat + self.interval);
        Ok(())
    }
}

/// A fixed window per client key: `max` in each `per`, the receiver's costly-offer limit's
/// shape (`stipendex::receiver::Builder::costly_quotes_per_client`).
#[derive(Debug)]
struct Windows {
    max: u32,
    per: Duration,
    windows: HashMap<PublicKey, (Instant, u32)>,
}

impl Windows {
    /// Whether `client` may have one more at `now` (`Err(wait)` if not); counts nothing.
    fn check(&self, client: &PublicKey, now: Instant) -> Result<(), Duration> {
        match self.windows.get(client) {
            Some(&(start, used)) if now.saturating_duration_since(start) < self.per => {
                if used >= self.max {
                    return Err((start + self.per).saturating_duration_since(now));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Counts one for `client` at `now`. Windows are only made for clients the server-wide
    /// rate admitted too, so at most the server-wide admissions of one window are live; stale
    /// ones are swept, and past [`MAX_WINDOWS`] the oldest goes.
    fn count(&mut self, client: PublicKey, now: Instant, live_bound: usize) {
        if self.windows.len() >= live_bound.min(MAX_WINDOWS) && !self.windows.contains_key(&client)
        {
            let per = self.per;
            self.windows
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < per);
            if self.windows.len() >= MAX_WINDOWS
                && let Some(oldest) = self
                    .windows
                    .iter()
                    .min_by_key(|(_, (start, _))| *start)
                    .map(|(k, _)| *k)
            {
                self.windows.remove(&oldest);
            }
        }
        let w = self.windows.entry(client).or_insert((now, 0));
        if now.saturating_duration_since(w.0) >= self.per {
            *w = (now, 0);
        }
        w.1 = w.1.saturating_add(1);
    }
}

/// Which limit refused a payment request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RateLimited {
    /// The client's own (its costly offers).
    Client(Duration),
    /// The server's, all clients together.
    Server(Duration),
}

/// The payment requests a server makes: per client key for costly ones, and server-wide.
#[derive(Debug)]
pub(crate) struct Rates {
    inner: Mutex<(Windows, Bucket)>,
    /// How many server-wide admissions one client window can span (a bound on live windows).
    live_bound: usize,
}

impl Rates {
    /// `per_client` costly payment requests per client key per window, `server` payment
    /// requests for the server (a bucket of `server.0`, refilled over `server.1`).
    pub(crate) fn new(per_client: (u32, Duration), server: (u32, Duration)) -> Self {
        // Within one client window the server admits its burst plus what refills meanwhile.
        let spans = per_client
            .1
            .as_millis()
            .checked_div(server.1.as_millis().max(1))
            .unwrap_or(0)
            .saturating_add(2);
        let live_bound = usize::try_from(u128::from(server.0.max(1)).saturating_mul(spans))
            .unwrap_or(MAX_WINDOWS)
            .min(MAX_WINDOWS);
        Rates {
            inner: Mutex::new((
                Windows {
                    max: per_client.0,
                    per: per_client.1,
                    windows: HashMap::new(),
                },
                Bucket::new(server.0, server.1),
            )),
            live_bound,
        }
    }

    /// Counts one payment request of `client` at `now`; `costly`: its offer is an object
    /// elsewhere (an invoice at the shop's wallet), counted against the client's limit. The
    /// client's limit is asked first, so a client past it never spends the server's.
    ///
    /// The client's part stands in for the receiver's own costly-offer limiter, which its
    /// crate does not expose: once `stipendex::receiver::Receiver` can count a costly offer
    /// for a client key (asked for in issue 47), that call replaces [`Windows`], and one window
    /// per key is shared with the receiver's Quotes.
    pub(crate) fn admit(
        &self,
        client: &PublicKey,
        costly: bool,
        now: Instant,
    ) -> Result<(), RateLimited> {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (windows, bucket) = &mut *g;
        if costly {
            windows.check(client, now).map_err(RateLimited::Client)?;
        }
        bucket.take(now).map_err(RateLimited::Server)?;
        if costly {
            windows.count(*client, now, self.live_bound);
        }
        Ok(())
    }

    #[cfg(test)]
    fn windows(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .windows
            .len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    fn key() -> PublicKey {
        nostr::Keys::generate().public_key()
    }

    fn id(n: u8) -> [u8; 32] {
        [n; 32]
    }

    #[tokio::test]
    async fn one_key_holds_at_most_its_share() {
        let now = Instant::now();
        let mut t = Table::new(100, 8);
        let k = key();
        for i in 0..8 {
            t.reserve(k, id(i), now + Duration::from_secs(60), now)
                .unwrap();
        }
        assert_eq!(
            t.reserve(k, id(9), now + Duration::from_secs(60), now)
                .unwrap_err(),
            Refused::ClientFull
        );
        assert_eq!(t.len_of(&k), 8);
        // The same invocation asked again replaces its own: still 8, and the old one is told.
        let before = t.entries.iter().find(|e| e.identity == id(3)).unwrap();
        let mut old = before.release.subscribe();
        let r = t
            .reserve(k, id(3), now + Duration::from_secs(60), now)
            .unwrap();
        assert_eq!(r.withdrawn, 1);
        assert!(*old.borrow_and_update(), "the replaced one stops waiting");
        assert_eq!(t.len_of(&k), 8);
        assert!(!r.deadline.released());
    }

    #[tokio::test]
    async fn a_full_table_takes_the_oldest_unpaid_of_the_client_with_the_most_never_a_paid_one() {
        let now = Instant::now();
        let until = now + Duration::from_secs(60);
        let mut t = Table::new(6, 8);
        let (a, b, c) = (key(), key(), key());
        let paid = t.reserve(c, id(0), until, now).unwrap().seq; // the oldest, paid
        t.paid(paid);
        let a1 = t.reserve(a, id(1), until, now).unwrap();
        t.reserve(b, id(2), until, now).unwrap();
        t.reserve(a, id(3), until, now).unwrap();
        t.reserve(a, id(4), until, now).unwrap();
        let granted = t.reserve(b, id(5), until, now).unwrap().seq;
        t.grant(granted, b, id(5), until);
        // Full: a newcomer takes a's oldest (a has 3 unpaid; c's older one is paid).
        let n = t.reserve(key(), id(6), until, now).unwrap();
        assert_eq!(n.withdrawn, 1);
        assert!(a1.deadline.released());
        assert_eq!(t.len(), 6);
        assert_eq!(t.len_of(&a), 2);
        assert_eq!(t.stage_of(&id(0)), Some(Stage::Paid));
        assert_eq!(t.stage_of(&id(5)), Some(Stage::Granted));
        // Only paid entries left: nothing may be taken.
        let mut full = Table::new(2, 8);
        let s1 = full.reserve(a, id(1), until, now).unwrap().seq;
        let s2 = full.reserve(b, id(2), until, now).unwrap().seq;
        full.paid(s1);
        full.grant(s2, b, id(2), until);
        assert_eq!(
            full.reserve(c, id(3), until, now).unwrap_err(),
            Refused::Full
        );
    }

    #[tokio::test]
    async fn a_flood_of_throwaway_keys_never_grows_the_table_and_the_newest_survives_longest() {
        let now = Instant::now();
        let until = now + Duration::from_secs(300);
        let mut t = Table::new(50, 8);
        let honest = key();
        let h = t.reserve(honest, id(255), until, now).unwrap();
        for i in 0..49u32 {
            let mut identity = [0u8; 32];
            identity[..4].copy_from_slice(&i.to_be_bytes());
            t.reserve(key(), identity, until, now).unwrap();
        }
        assert!(!h.deadline.released(), "49 newer arrivals leave it");
        for i in 0..10_000u32 {
            let mut identity = [1u8; 32];
            identity[..4].copy_from_slice(&i.to_be_bytes());
            t.reserve(key(), identity, until, now).unwrap();
            assert!(t.len() <= 50);
        }
        assert!(h.deadline.released(), "the oldest went first");
    }

    #[tokio::test]
    async fn finished_entries_go_granted_ones_stay_until_claimed_or_expired() {
        let now = Instant::now();
        let until = now + Duration::from_secs(60);
        let mut t = Table::new(10, 8);
        let k = key();
        let s = t.reserve(k, id(1), until, now).unwrap().seq;
        t.finish(s);
        assert_eq!(t.len(), 0);
        let s = t.reserve(k, id(2), until, now).unwrap().seq;
        t.grant(s, k, id(2), now + Duration::from_secs(5));
        t.finish(s);
        assert_eq!(t.stage_of(&id(2)), Some(Stage::Granted));
        assert!(t.claim(&id(2), now));
        assert!(!t.claim(&id(2), now), "one payment, one run");
        let s = t.reserve(k, id(3), until, now).unwrap().seq;
        t.grant(s, k, id(3), now + Duration::from_secs(5));
        t.sweep(now + Duration::from_secs(6));
        assert_eq!(t.len(), 0, "an expired grant is swept");
        // An unpaid entry whose admission stalled is swept after its deadline and a grace.
        let r = t.reserve(k, id(4), until, now).unwrap();
        t.sweep(until + STALE_GRACE);
        assert_eq!(t.len(), 0);
        assert!(r.deadline.released());
    }

    #[tokio::test]
    async fn a_withdrawn_payment_request_paid_as_it_went_keeps_its_authorization() {
        let now = Instant::now();
        let until = now + Duration::from_secs(60);
        let mut t = Table::new(2, 8);
        let (a, b, c) = (key(), key(), key());
        let r = t.reserve(a, id(1), until, now).unwrap();
        t.reserve(b, id(2), until, now).unwrap();
        t.reserve(c, id(3), until, now).unwrap();
        assert!(r.deadline.released(), "a's went for c's");
        // Its payment had been seen: the authorization comes back, in place of an unpaid one.
        t.grant(r.seq, a, id(1), until);
        assert_eq!(t.len(), 2);
        assert!(t.claim(&id(1), now));
    }

    #[test]
    fn the_bucket_admits_its_burst_then_its_rate() {
        let now = Instant::now();
        let mut b = Bucket::new(10, Duration::from_secs(10));
        for _ in 0..10 {
            b.take(now).unwrap();
        }
        let wait = b.take(now).unwrap_err();
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
        b.take(now + Duration::from_secs(1)).unwrap();
        assert!(b.take(now + Duration::from_secs(1)).is_err());
    }

    #[test]
    fn a_client_past_its_limit_never_spends_the_servers_and_windows_stay_bounded() {
        let now = Instant::now();
        let r = Rates::new((3, Duration::from_secs(60)), (100, Duration::from_secs(10)));
        let k = key();
        for _ in 0..3 {
            r.admit(&k, true, now).unwrap();
        }
        for _ in 0..1000 {
            assert!(matches!(
                r.admit(&k, true, now),
                Err(RateLimited::Client(_))
            ));
        }
        // The server's bucket still has 97.
        for _ in 0..97 {
            r.admit(&key(), true, now).unwrap();
        }
        assert!(matches!(
            r.admit(&key(), true, now),
            Err(RateLimited::Server(_))
        ));
        // A flood of throwaway keys over a long time: windows never exceed the live bound.
        let mut t = now;
        for _ in 0..4_000 {
            t += Duration::from_millis(100);
            let _ = r.admit(&key(), true, t);
            assert!(r.windows() <= r.live_bound + 1, "{}", r.windows());
        }
        assert!(r.live_bound <= MAX_WINDOWS);
    }
}
