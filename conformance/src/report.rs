//! Running the suite and reporting: the result rows, the matrix, JSON and JUnit.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use serde::Serialize;

use crate::behaviours::{self, Behaviour, Needs};
use crate::harness::{Harness, HarnessError, RailEntry, Tier};

/// A behaviour's outcome on one rail and tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It held.
    Pass,
    /// It did not (or a claimed capability failed, or a required localnet was missing in CI).
    Fail,
    /// Not run: the capability is not claimed, or the localnet is missing outside CI.
    Skip,
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ResultRow {
    /// Rail name.
    pub rail: String,
    /// Behaviour name.
    pub behaviour: String,
    /// Tier.
    pub tier: Tier,
    /// Outcome.
    pub outcome: Outcome,
    /// Wall time in milliseconds (harness setup included).
    pub ms: u64,
    /// Why it failed or was skipped.
    pub detail: String,
}

/// Longest a behaviour may take.
pub const BEHAVIOUR_TIMEOUT: Duration = Duration::from_secs(120);

fn claimed(caps: &rail_core::Capabilities, needs: Needs) -> bool {
    match needs {
        Needs::Nothing => true,
        Needs::Pay => caps.pay,
        Needs::Hold => caps.hold,
        Needs::PartialCapture => caps.partial_capture,
        Needs::Refund => caps.refund,
        Needs::PartialRefund => caps.partial_refund,
    }
}

/// Runs every behaviour of the rail suite matching `only` (all when empty) for `entry` on
/// `tier`, calling `progress` after each.
pub async fn run_rail_tier(
    entry: &RailEntry,
    tier: Tier,
    only: &[String],
    progress: &mut (dyn FnMut(&ResultRow) + Send),
) -> Vec<ResultRow> {
    let list = select(&behaviours::all(), only);
    run_behaviours(entry, &list, tier, progress).await
}

/// The behaviours of `list` whose name is in `only` (all of them when `only` is empty).
#[must_use]
pub fn select<H: ?Sized>(list: &[Behaviour<H>], only: &[String]) -> Vec<Behaviour<H>> {
    list.iter()
        .filter(|b| only.is_empty() || only.iter().any(|o| o == b.name))
        .copied()
        .collect()
}

/// Runs `list` for `entry` on `tier`, one fresh harness per behaviour, calling `progress` after
/// each: the engine of [`run_rail_tier`], generic over the harness so that a suite built on
/// this one (its harness an extension trait of [`crate::Harness`]) reports the same way.
pub async fn run_behaviours<H: ?Sized + Harness>(
    entry: &RailEntry<H>,
    list: &[Behaviour<H>],
    tier: Tier,
    progress: &mut (dyn FnMut(&ResultRow) + Send),
) -> Vec<ResultRow> {
    run_with(entry.name, entry.tiers, &entry.make, list, tier, progress).await
}

/// What builds one fresh harness of type `H` for a tier.
pub type Make<'a, H> =
    dyn Fn(Tier) -> BoxFuture<'static, Result<Box<H>, HarnessError>> + Send + Sync + 'a;

/// [`run_behaviours`] for a rail named `name` offering `tiers`, whose harnesses `make` builds:
/// for a suite that runs this crate's behaviours on harnesses of an extension trait (it passes
/// a `make` that upcasts them to `Box<dyn Harness>`).
pub async fn run_with<H: ?Sized + Harness>(
    name: &str,
    tiers: &[(Tier, &'static str)],
    make: &Make<'_, H>,
    list: &[Behaviour<H>],
    tier: Tier,
    progress: &mut (dyn FnMut(&ResultRow) + Send),
) -> Vec<ResultRow> {
    let mut rows = Vec::new();
    let row = |b: &Behaviour<H>, outcome, ms, detail: String| ResultRow {
        rail: name.to_owned(),
        behaviour: b.name.to_owned(),
        tier,
        outcome,
        ms,
        detail,
    };
    let offered = tiers.iter().any(|(t, _)| *t == tier);
    for b in list {
        if !offered {
            let r = row(
                b,
                Outcome::Skip,
                0,
                format!("the rail offers no {tier} tier"),
            );
            progress(&r);
            rows.push(r);
            continue;
        }
        let start = Instant::now();
        let harness = match make(tier).await {
            Ok(h) => h,
            Err(HarnessError::Unavailable(why)) => {
                let (outcome, detail) = if test_kit::localnet::in_ci() {
                    (
                        Outcome::Fail,
                        format!("localnet required in CI but unavailable: {why}"),
                    )
                } else {
                    (Outcome::Skip, format!("localnet unavailable: {why}"))
                };
                let r = row(b, outcome, 0, detail);
                progress(&r);
                rows.push(r);
                continue;
            }
            Err(e) => {
                let r = row(b, Outcome::Fail, elapsed(start), e.to_string());
                progress(&r);
                rows.push(r);
                continue;
            }
        };
        let caps = harness.rail().capabilities();
        let r = if claimed(&caps, b.needs) {
            match tokio::time::timeout(BEHAVIOUR_TIMEOUT, (b.run)(&*harness)).await {
                Ok(Ok(())) => row(b, Outcome::Pass, elapsed(start), String::new()),
                Ok(Err(why)) if why.starts_with(behaviours::SKIP) => row(b, Outcome::Skip, 0, why),
                Ok(Err(why)) => row(b, Outcome::Fail, elapsed(start), why),
                Err(_) => row(
                    b,
                    Outcome::Fail,
                    elapsed(start),
                    format!("timed out after {BEHAVIOUR_TIMEOUT:?}"),
                ),
            }
        } else {
            row(
                b,
                Outcome::Skip,
                0,
                format!("capability not claimed ({:?})", b.needs),
            )
        };
        harness.teardown().await;
        progress(&r);
        rows.push(r);
    }
    rows
}

fn elapsed(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Counts of each outcome.
#[must_use]
pub fn counts(rows: &[ResultRow]) -> (usize, usize, usize) {
    let n = |o| rows.iter().filter(|r| r.outcome == o).count();
    (n(Outcome::Pass), n(Outcome::Fail), n(Outcome::Skip))
}

/// The matrix: behaviour × (rail, tier) → outcome and milliseconds, then the details of every
/// failure and skip, then the closing `N passed, N failed, N skipped` line.
#[must_use]
pub fn matrix(rows: &[ResultRow]) -> String {
    let mut cols: Vec<(String, Tier)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut cell: BTreeMap<(String, String, Tier), &ResultRow> = BTreeMap::new();
    for r in rows {
        if !cols.contains(&(r.rail.clone(), r.tier)) {
            cols.push((r.rail.clone(), r.tier));
        }
        if !names.contains(&r.behaviour) {
            names.push(r.behaviour.clone());
        }
        cell.insert((r.behaviour.clone(), r.rail.clone(), r.tier), r);
    }
    let w = names.iter().map(String::len).max().unwrap_or(9).max(9);
    let mut out = String::new();
    let _ = write!(out, "{:w$}", "behaviour");
    for (rail, tier) in &cols {
        let _ = write!(out, " | {:<16}", format!("{rail}/{tier}"));
    }
    out.push('\n');
    let _ = writeln!(out, "{}", "-".repeat(w + cols.len() * 19));
    for n in &names {
        let _ = write!(out, "{n:w$}");
        for (rail, tier) in &cols {
            let text = match cell.get(&(n.clone(), rail.clone(), *tier)) {
                Some(r) => match r.outcome {
                    Outcome::Pass => format!("pass {:>6}ms", r.ms),
                    Outcome::Fail => format!("FAIL {:>6}ms", r.ms),
                    Outcome::Skip => "skip".to_owned(),
                },
                None => "-".to_owned(),
            };
            let _ = write!(out, " | {text:<16}");
        }
        out.push('\n');
    }
    let notes: Vec<&ResultRow> = rows.iter().filter(|r| r.outcome != Outcome::Pass).collect();
    if !notes.is_empty() {
        out.push('\n');
        for r in notes {
            let tag = if r.outcome == Outcome::Fail {
                "FAIL"
            } else {
                "skip"
            };
            let _ = writeln!(
                out,
                "{tag} {}/{} {}: {}",
                r.rail, r.tier, r.behaviour, r.detail
            );
        }
    }
    let (p, f, s) = counts(rows);
    let total_ms: u64 = rows.iter().map(|r| r.ms).sum();
    let _ = writeln!(out, "\nconformance ran in {total_ms} ms of behaviour time");
    let _ = writeln!(out, "{p} passed, {f} failed, {s} skipped");
    out
}

/// The JSON report: `{"results":[{"rail","behaviour","tier","outcome","ms","detail"}]}`.
///
/// # Errors
/// Never in practice (plain data); kept fallible for serde.
pub fn json(rows: &[ResultRow]) -> serde_json::Result<String> {
    serde_json::to_string_pretty(&serde_json::json!({ "results": rows }))
}

fn xml_escape(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control() || *c == '\n' || *c == '\t')
        .map(|c| match c {
            '&' => "&amp;".to_owned(),
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&apos;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// Milliseconds as decimal seconds, without floats.
fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The JUnit XML report: one `testsuite` per rail and tier.
#[must_use]
pub fn junit(rows: &[ResultRow]) -> String {
    let mut suites: BTreeMap<(String, Tier), Vec<&ResultRow>> = BTreeMap::new();
    for r in rows {
        suites.entry((r.rail.clone(), r.tier)).or_default().push(r);
    }
    let (_, f, s) = counts(rows);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"conformance\" tests=\"{}\" failures=\"{f}\" skipped=\"{s}\">",
        rows.len()
    );
    for ((rail, tier), rs) in suites {
        let (_, sf, ss) = counts(&rs.iter().map(|r| (*r).clone()).collect::<Vec<_>>());
        let secs = seconds(rs.iter().map(|r| r.ms).sum::<u64>());
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}.{}\" tests=\"{}\" failures=\"{sf}\" skipped=\"{ss}\" time=\"{secs}\">",
            xml_escape(&rail),
            tier,
            rs.len()
        );
        for r in rs {
            let secs = seconds(r.ms);
            let _ = write!(
                out,
                "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{secs}\"",
                xml_escape(&r.rail),
                r.tier,
                xml_escape(&r.behaviour)
            );
            match r.outcome {
                Outcome::Pass => out.push_str("/>\n"),
                Outcome::Fail => {
                    let _ = writeln!(
                        out,
                        "><failure message=\"{}\"/></testcase>",
                        xml_escape(&r.detail)
                    );
                }
                Outcome::Skip => {
                    let _ = writeln!(
                        out,
                        "><skipped message=\"{}\"/></testcase>",
                        xml_escape(&r.detail)
                    );
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}
