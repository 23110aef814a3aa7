//! What the configured rails depend on outside this process, as probes a readiness check can
//! run: an x402 receiver's facilitator (`GET {facilitator_url}/supported`, with the rail's
//! credentials), and so on for any rail that names a service it cannot work without.
//!
//! [`dependencies_of_file`] (or [`dependencies_of_toml`]) reads the same configuration as
//! [`super::Registry`] and returns one [`Dependency`] per service; [`Probes`] runs them for a
//! readiness endpoint, at most once per period whatever the number of callers, so the endpoint
//! cannot be used to flood the services it probes.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::config::{self, Env, ProcessEnv};
use crate::Error;

/// A service a configured rail needs, that can be asked whether it answers.
///
/// `check` answers:
/// - `Ok(())`: the service answered as expected now;
/// - `Err(reason)`: it did not (not reached, timed out, refused our credentials, answered
///   something else), in one sentence without secrets, fit for a log and a readiness body.
///
/// A check moves nothing and may run at any time; it should give up within a few seconds.
#[async_trait]
pub trait Dependency: Send + Sync + fmt::Debug {
    /// What it is, for people: `facilitator https://x402.org/facilitator`.
    fn name(&self) -> String;

    /// Whether it answers now.
    ///
    /// # Errors
    /// Why it does not, in one sentence.
    async fn check(&self) -> Result<(), String>;
}

/// The dependencies of the rails configured in the TOML `text`, their secrets read from `env`
/// (one per service: a receiving x402 rail's facilitator).
///
/// # Errors
/// [`Error`] for a configuration [`super::Registry::from_toml`] refuses too (a rail's section,
/// a credential's variable).
pub fn dependencies_of_toml(text: &str, env: &dyn Env) -> Result<Vec<Arc<dyn Dependency>>, Error> {
    let file: config::File =
        toml::from_str(text).map_err(|e| Error::Config(e.message().to_owned()))?;
    let mut out: Vec<Arc<dyn Dependency>> = Vec::new();
    for (name, table) in &file.rails {
        out.extend(super::dependencies_of_rail(name, table, env)?);
    }
    Ok(out)
}

/// [`dependencies_of_toml`] of the file at `path`, secrets from the process environment.
///
/// # Errors
/// [`Error::Io`] if the file cannot be read, else as [`dependencies_of_toml`].
pub fn dependencies_of_file(path: impl AsRef<Path>) -> Result<Vec<Arc<dyn Dependency>>, Error> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    dependencies_of_toml(&text, &ProcessEnv)
}

/// Dependencies probed for a readiness check, the answers kept for a period: however often
/// [`Probes::failing`] is called, each dependency is asked at most once per period (callers
/// during a probe wait for its answers).
pub struct Probes {
    dependencies: Vec<Arc<dyn Dependency>>,
    period: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Vec<String>)>>,
}

impl fmt::Debug for Probes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Probes")
            .field("dependencies", &self.dependencies)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Default for Probes {
    fn default() -> Self {
        Probes::new(Vec::new())
    }
}

impl Probes {
    /// How long answers are kept by default.
    pub const PERIOD: Duration = Duration::from_secs(5);

    /// Probes of `dependencies`, answers kept [`Probes::PERIOD`].
    #[must_use]
    pub fn new(dependencies: Vec<Arc<dyn Dependency>>) -> Self {
        Probes {
            dependencies,
            period: Self::PERIOD,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Answers kept `period` instead.
    #[must_use]
    pub const fn every(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// The dependencies probed.
    #[must_use]
    pub fn dependencies(&self) -> &[Arc<dyn Dependency>] {
        &self.dependencies
    }

    /// One sentence per dependency that does not answer (`facilitator http://127.0.0.1:9
    /// unreachable: …`), none when all do: from the last probe if it is younger than the
    /// period, else from a probe run now (each dependency asked concurrently).
    pub async fn failing(&self) -> Vec<String> {
        if self.dependencies.is_empty() {
            return Vec::new();
        }
        let mut last = self.last.lock().await;
        if let Some((at, failing)) = last.as_ref()
            && at.elapsed() < self.period
        {
            return failing.clone();
        }
        let mut probes = tokio::task::JoinSet::new();
        for (i, d) in self.dependencies.iter().enumerate() {
            let d = d.clone();
            probes.spawn(async move { (i, d.name(), d.check().await) });
        }
        let mut failing: Vec<(usize, String)> = Vec::new();
        while let Some(done) = probes.join_next().await {
            match done {
                Ok((_, _, Ok(()))) => {}
                Ok((i, name, Err(why))) => {
                    tracing::warn!(dependency = %name, error = %why, "a dependency does not answer");
                    failing.push((i, format!("{name} unreachable: {why}")));
                }
                Err(e) => failing.push((usize::MAX, format!("a dependency probe failed: {e}"))),
            }
        }
        failing.sort();
        let failing: Vec<String> = failing.into_iter().map(|(_, f)| f).collect();
        *last = Some((Instant::now(), failing.clone()));
        failing
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[derive(Debug)]
    struct Counted(Arc<AtomicUsize>, bool);

    #[async_trait]
    impl Dependency for Counted {
        fn name(&self) -> String {
            "facilitator http://127.0.0.1:9".into()
        }
        async fn check(&self) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            if self.1 {
                Ok(())
            } else {
                Err("connection refused".into())
            }
        }
    }

    #[tokio::test]
    async fn answers_are_kept_for_a_period_whatever_the_callers() {
        let n = Arc::new(AtomicUsize::new(0));
        let probes = Arc::new(Probes::new(vec![Arc::new(Counted(n.clone(), false))]));
        let many: Vec<_> = (0..20)
            .map(|_| {
                let p = probes.clone();
                tokio::spawn(async move { p.failing().await })
            })
            .collect();
        for h in many {
            assert_eq!(
                h.await.unwrap(),
                ["facilitator http://127.0.0.1:9 unreachable: connection refused"]
            );
        }
        assert_eq!(n.load(Ordering::SeqCst), 1, "one probe for twenty callers");
        let fresh = Probes::new(vec![Arc::new(Counted(n.clone(), true))]).every(Duration::ZERO);
        assert!(fresh.failing().await.is_empty());
        assert!(fresh.failing().await.is_empty());
        assert_eq!(n.load(Ordering::SeqCst), 3);
        assert!(Probes::default().failing().await.is_empty());
    }

    #[test]
    fn a_configuration_without_remote_services_has_no_dependencies() {
        let text = "[rails.house]\nkind = \"ledger\"\nurl = \"sqlite://x.db\"\npayee_account = \"00000000000000000000000000000b0b\"\n";
        let env = std::collections::BTreeMap::<String, String>::new();
        assert!(dependencies_of_toml(text, &env).unwrap().is_empty());
    }
}
