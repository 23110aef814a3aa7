//! Counting `tracing` events of one target, on the current thread: what a test counts to show
//! a step runs once (the receiver emits one `stipendex::decide` event per pricing decision).
//! A `#[tokio::test]` (one thread) runs its server and its client where this counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the events of `target` on this thread while it lives.
pub struct Events {
    count: Arc<AtomicUsize>,
    _guard: tracing::subscriber::DefaultGuard,
}

struct Count {
    target: &'static str,
    count: Arc<AtomicUsize>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if e.metadata().target() == self.target {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Registers, once per process, a dispatcher that is never dropped (see `Events::count`).
fn keep_two_dispatchers() {
    static KEPT: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
}

impl Events {
    /// Starts counting the events of `target` on this thread.
    #[must_use]
    pub fn count(target: &'static str) -> Self {
        use tracing_subscriber::layer::SubscriberExt as _;
        let count = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(Count {
            target,
            count: count.clone(),
        });
        // tracing-core 0.1 computes a new callsite's interest against the registering
        // thread's default alone while one dispatcher is registered (`has_just_one`): a callsite
        // first reached on another test's thread (no subscriber there) would be cached as
        // "never" for this one too (seen in CI: 0 of 6 decisions counted). A second dispatcher
        // that lives as long as the process makes every registration ask all of them.
        keep_two_dispatchers();
        let guard = tracing::subscriber::set_default(subscriber);
        // A callsite registered before this subscriber existed: ask every callsite again.
        tracing::callsite::rebuild_interest_cache();
        Events {
            count,
            _guard: guard,
        }
    }

    /// The events counted since the last `take`.
    pub fn take(&self) -> usize {
        self.count.swap(0, Ordering::SeqCst)
    }
}
