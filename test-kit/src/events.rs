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
        let guard = tracing::subscriber::set_default(subscriber);
        // Another test's thread may have registered the counted callsite at the same moment,
        // its interest then cached without this subscriber (seen: a decision missed about one
        // run in ten): ask every callsite again, now that this subscriber is in place.
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
