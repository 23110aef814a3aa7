//! Time as the rails see it: [`Timestamp`] (milliseconds since the Unix epoch) and an injectable
//! [`Clock`], so expiry is tested by moving a [`ManualClock`], never by sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// `self + d`, saturating at the far future.
    #[must_use]
    pub fn plus(self, d: Duration) -> Timestamp {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// Milliseconds since the epoch.
    #[must_use]
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the epoch (rounded down).
    #[must_use]
    pub const fn unix_seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// The instant in RFC 3339, UTC, to the second (the milliseconds dropped), as a person
    /// reads it in a message: `2026-12-06T13:33:18Z`. See [`rfc3339`] for the range.
    ///
    /// ```
    /// use rail_core::clock::Timestamp;
    /// assert_eq!(Timestamp(1_796_563_998_250).rfc3339(), "2026-12-06T13:33:18Z");
    /// ```
    #[must_use]
    pub fn rfc3339(self) -> String {
        rfc3339_signed(self.unix_seconds())
    }
}

/// `secs` seconds after the Unix epoch in RFC 3339, UTC, to the second
/// (`2026-12-06T13:33:18Z`): the one way a time is written where a person reads it (an error
/// message, a prompt, a log line). RFC 3339 writes years 0000 to 9999 only: a later instant
/// (a validity written as "forever") is written as the last second of 9999.
///
/// ```
/// assert_eq!(rail_core::clock::rfc3339(0), "1970-01-01T00:00:00Z");
/// assert_eq!(rail_core::clock::rfc3339(1_796_563_998), "2026-12-06T13:33:18Z");
/// ```
#[must_use]
pub fn rfc3339(secs: u64) -> String {
    rfc3339_signed(i64::try_from(secs).unwrap_or(i64::MAX))
}

/// The first second of year 0000 and the last of year 9999, in seconds since the epoch: the
/// range RFC 3339 can write.
const RFC3339_MIN: i64 = -62_167_219_200;
const RFC3339_MAX: i64 = 253_402_300_799;

fn rfc3339_signed(secs: i64) -> String {
    let secs = secs.clamp(RFC3339_MIN, RFC3339_MAX);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The proleptic Gregorian (year, month, day) of `days` days after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`: eras of 400 years, each starting on 1 March).
const fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // year of era, [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from 1 March, [0, 365]
    let mp = (5 * doy + 2) / 153; // month from March, [0, 11]
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Timestamp(ms)
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use rail_core::clock::{Clock, ManualClock, Timestamp};
/// use std::time::Duration;
/// let clock = ManualClock::at(Timestamp(1_000));
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), Timestamp(3_000));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock stopped at `t`.
    #[must_use]
    pub fn at(t: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicI64::new(t.0)))
    }

    /// A clock stopped at the current wall-clock time.
    #[must_use]
    pub fn starting_now() -> Self {
        Self::at(SystemClock.now())
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `t`.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_at_the_epoch() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp(0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp(999).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp(-1).rfc3339(), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn rfc3339_on_leap_days() {
        // 2024-02-29T12:00:00Z, and the day after.
        assert_eq!(rfc3339(1_709_208_000), "2024-02-29T12:00:00Z");
        assert_eq!(rfc3339(1_709_208_000 + 86_400), "2024-03-01T12:00:00Z");
        // 2000 is a leap year (divisible by 400); 2100 is not (by 100).
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn rfc3339_on_2026_12_06() {
        assert_eq!(rfc3339(1_796_563_998), "2026-12-06T13:33:18Z");
        assert_eq!(
            Timestamp(1_796_563_998_999).rfc3339(),
            "2026-12-06T13:33:18Z"
        );
        assert_eq!(rfc3339(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(rfc3339(1_798_761_600), "2027-01-01T00:00:00Z");
    }

    #[test]
    fn rfc3339_beyond_year_9999_is_its_last_second() {
        assert_eq!(rfc3339(253_402_300_799), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
        assert_eq!(Timestamp(i64::MIN).rfc3339(), "0000-01-01T00:00:00Z");
    }

    #[test]
    fn rfc3339_agrees_with_day_counting_for_every_day_of_four_centuries() {
        // Walk day by day from 1970 and count the calendar by hand.
        let (mut y, mut m, mut d) = (1970_i64, 1_i64, 1_i64);
        for days in 0..146_097_i64 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
            let len = match m {
                2 if leap => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            d += 1;
            if d > len {
                d = 1;
                m += 1;
                if m > 12 {
                    m = 1;
                    y += 1;
                }
            }
        }
    }
}
