//! The group commit both SQL key stores use. One task takes every write of a store (of all its
//! clones) and hands what is queued to the store's `commit` as one batch; each write is
//! answered only after its batch committed, so every answer is durable. A batch whose commit
//! fails answers every write in it with the error, and none of it was written.
//!
//! **Order.** A batch holds at most one write per key, and no key is in two batches in flight.
//! A write that cannot join a batch (its key is taken or in flight, the batch is full, or it
//! was made under another kind of clock) waits, and so does every later write of its key:
//! writes of one key run in the order they were made, one after another, as they would alone.
//! Writes of different keys commute, so a batch may run its writes in any order — which lets a
//! store write a batch as a few set-wise statements instead of one statement per write.

use std::collections::{HashSet, VecDeque};
use std::future::Future;

use tokio::sync::{mpsc, oneshot};

use super::Op;
use crate::error::{RailError, RailResult};

/// A write waiting for the group commit, and who waits for its answer.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) op: Op,
    /// The namespace and key `op` is to, owned once for the batch's bookkeeping.
    pub(super) key: (String, String),
    /// The injected clock's time when the write was made, or `None` for the database's.
    pub(super) now: Option<i64>,
    done: oneshot::Sender<RailResult<bool>>,
}

impl Job {
    /// A write run outside the group commit (its answer goes nowhere; the caller takes the
    /// batch's result itself).
    #[cfg(feature = "postgres")]
    pub(super) fn alone(op: Op, now: Option<i64>) -> Self {
        Job::new(op, now, oneshot::channel().0)
    }

    fn new(op: Op, now: Option<i64>, done: oneshot::Sender<RailResult<bool>>) -> Self {
        let (ns, key) = op.key();
        let key = (ns.to_owned(), key.to_owned());
        Job { op, key, now, done }
    }
}

/// A batch's time: the latest an injected clock gave (the batch commits after every write in
/// it was made), or `None` for the database's. A batch never mixes the two kinds.
pub(super) fn batch_now(batch: &[Job]) -> Option<i64> {
    batch.iter().filter_map(|j| j.now).max()
}

/// The most writes one batch takes.
pub(super) const MAX_BATCH: usize = 512;

/// Where a store's batches are written: its database's pool.
pub(super) trait Batches: Clone + Send + Sync + 'static {
    /// Runs `batch` (distinct keys): whether each write took effect, in the batch's order, or
    /// the error that left all of it unwritten.
    fn commit<'a>(
        &'a self,
        batch: &'a [Job],
    ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send + 'a;
}

/// The handle a store's clones share to send writes to its group commit.
#[derive(Debug, Clone)]
pub(super) struct Writes(mpsc::Sender<Job>);

impl Writes {
    /// Starts the group commit: batches are written to `to`, with up to `depth` in flight at
    /// once. Before sending a batch
    /// the writer yields up to `linger` times for more writes: a yield costs microseconds and
    /// lets callers just answered submit again and share the commit (the ledger's group commit
    /// does the same) — worth it where one batch is in flight at a time, not where a free
    /// connection can take the write at once.
    pub(super) fn start(to: impl Batches, depth: usize, linger: usize) -> Self {
        let (writes, jobs) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(writer(jobs, depth.max(1), linger, to));
        Writes(writes)
    }

    /// Runs `op` through the group commit: whether it took effect, once its batch committed.
    pub(super) async fn write(&self, op: Op, now: Option<i64>) -> RailResult<bool> {
        let (done, answer) = oneshot::channel();
        self.0
            .send(Job::new(op, now, done))
            .await
            .map_err(|_| RailError::Storage("the key store's writer stopped".into()))?;
        answer.await.map_err(|_| {
            RailError::Storage(
                "the key store's writer stopped before the write was answered".into(),
            )
        })?
    }
}

async fn writer(mut jobs: mpsc::Receiver<Job>, depth: usize, linger: usize, to: impl Batches) {
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut busy: HashSet<(String, String)> = HashSet::new();
    let mut inflight: tokio::task::JoinSet<Vec<(String, String)>> = tokio::task::JoinSet::new();
    let mut closed = false;
    loop {
        if inflight.len() < depth {
            let batch = gather(&mut jobs, &mut waiting, &busy, linger, &mut closed).await;
            if !batch.is_empty() {
                let keys: Vec<(String, String)> = batch.iter().map(|j| j.key.clone()).collect();
                busy.extend(keys.iter().cloned());
                let to = to.clone();
                inflight.spawn(async move {
                    let result = to.commit(&batch).await;
                    answer(batch, result);
                    keys
                });
                continue;
            }
        }
        tokio::select! {
            done = inflight.join_next(), if !inflight.is_empty() => match done {
                Some(Ok(keys)) => {
                    for k in &keys {
                        busy.remove(k);
                    }
                }
                // A batch task that panicked answered nobody (its callers see the writer's
                // error as their answers are dropped); its keys are unknown here, so they are
                // freed once no batch is in flight.
                Some(Err(e)) => {
                    tracing::error!(error = %e, "a key-store batch task failed");
                    if inflight.is_empty() {
                        busy.clear();
                    }
                }
                None => {}
            },
            job = jobs.recv(), if !closed && inflight.len() < depth => match job {
                Some(j) => waiting.push_back(j),
                None => closed = true,
            },
            else => {
                if waiting.is_empty() {
                    return;
                }
            }
        }
    }
}

/// Answers every write of a batch: each its own outcome, or the batch's error.
fn answer(batch: Vec<Job>, result: Result<Vec<bool>, sqlx::Error>) {
    match result {
        Ok(took) if took.len() == batch.len() => {
            for (job, took) in batch.into_iter().zip(took) {
                let _ = job.done.send(Ok(took));
            }
        }
        Ok(took) => {
            let why = format!(
                "a batch of {} writes was answered {} times",
                batch.len(),
                took.len()
            );
            for job in batch {
                let _ = job.done.send(Err(RailError::Storage(why.clone())));
            }
        }
        Err(e) => {
            let why = e.to_string();
            for job in batch {
                let _ = job.done.send(Err(RailError::Storage(why.clone())));
            }
        }
    }
}

/// Takes the next batch: the writes held back before, in order, then what is queued, each only
/// if it may join (see the module's order rules).
async fn gather(
    jobs: &mut mpsc::Receiver<Job>,
    waiting: &mut VecDeque<Job>,
    busy: &HashSet<(String, String)>,
    linger: usize,
    closed: &mut bool,
) -> Vec<Job> {
    let mut batch: Vec<Job> = Vec::new();
    let mut taken: HashSet<(String, String)> = HashSet::new();
    let mut held: HashSet<(String, String)> = HashSet::new();
    let mut still = VecDeque::new();
    let mut offer = |j: Job, batch: &mut Vec<Job>, still: &mut VecDeque<Job>| {
        let k = j.key.clone();
        let clock_fits = batch
            .first()
            .is_none_or(|b| b.now.is_some() == j.now.is_some());
        if batch.len() < MAX_BATCH
            && clock_fits
            && !busy.contains(&k)
            && !held.contains(&k)
            && taken.insert(k.clone())
        {
            batch.push(j);
        } else {
            held.insert(k);
            still.push_back(j);
        }
    };
    while let Some(j) = waiting.pop_front() {
        offer(j, &mut batch, &mut still);
    }
    let mut yields = 0;
    while !*closed && batch.len() < MAX_BATCH {
        match jobs.try_recv() {
            Ok(j) => offer(j, &mut batch, &mut still),
            Err(mpsc::error::TryRecvError::Disconnected) => *closed = true,
            Err(_) if yields < linger && !batch.is_empty() => {
                yields += 1;
                tokio::task::yield_now().await;
            }
            Err(_) => break,
        }
    }
    *waiting = still;
    batch
}
