//! Human in the loop: the [`Confirmer`] a wallet asks before a payment above the mandate's
//! threshold (and before every checkout), and tells when it denies a receiver.

use std::io::{BufRead as _, Write as _};
use std::sync::Arc;

use async_trait::async_trait;
use rail_core::{Amount, Money};

/// Why the wallet asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The amount is above the mandate's `confirm_above`.
    AboveThreshold,
    /// A checkout (estimate + tolerance): confirmation is mandatory.
    Checkout,
}

/// What the human is asked: who, what for, how much, and what the mandate still allows.
#[derive(Clone, Debug)]
pub struct Ask {
    /// Why the wallet asks.
    pub why: Why,
    /// The receiver (its id, or an origin / MCP server).
    pub receiver: String,
    /// What the receiver says the payment is for.
    pub description: Option<String>,
    /// The total (the amount, or the estimate).
    pub total: Money,
    /// How far above the total the final amount may go (zero for a fixed amount).
    pub tolerance: Amount,
    /// What the mandate still allows in the current period, if it limits periods.
    pub left_in_period: Option<Money>,
    /// What the mandate still allows in total, if it limits the total.
    pub left_in_total: Option<Money>,
}

/// The most characters of a receiver's description a prompt shows (escapes counted, the
/// quotes not), then `…`.
pub const DESCRIPTION_MAX: usize = 200;
/// The most characters of a receiver's name a prompt shows (escapes counted), then `…`.
pub const RECEIVER_MAX: usize = 100;

/// Whether `c` is shown as a visible `\u{..}` escape: a control character (escape sequences,
/// carriage returns, new lines), a bidirectional-override or -isolate mark, a line or paragraph
/// separator, or an invisible character (zero-width space and joiners, word joiner, byte-order
/// mark, soft hyphen).
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{061c}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{200b}'..='\u{200d}'
                | '\u{2060}'..='\u{2064}'
                | '\u{feff}'
                | '\u{180e}'
                | '\u{00ad}'
        )
}

/// `s` with every control character (escape sequences, carriage returns, new lines), every
/// bidirectional-override character, line or paragraph separator and invisible character
/// written as a visible `\u{..}` escape: text a receiver chose (its id, a description) cannot
/// redraw, reorder or break the prompt a human answers.
#[must_use]
pub fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if hidden(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// [`printable`], at most `max` characters shown (escapes counted): a longer text is cut at a
/// character (never inside an escape) and ends with `…`. With `quoted`, a `"` or `\` of the
/// text is escaped too (`\"`, `\\`), so the text cannot close the quotes it is shown in nor
/// pass for one of the escapes.
pub(crate) fn bounded(s: &str, max: usize, quoted: bool) -> String {
    let pieces = s.chars().map(|c| {
        if hidden(c) {
            c.escape_unicode().collect::<String>()
        } else if quoted && matches!(c, '"' | '\\') {
            format!("\\{c}")
        } else {
            c.to_string()
        }
    });
    let mut out = String::new();
    let mut shown = 0;
    let mut rest = pieces.peekable();
    while let Some(p) = rest.next() {
        let n = p.chars().count();
        // Room is kept for the ellipsis unless this is the last piece and it fits.
        let room = if rest.peek().is_none() {
            max
        } else {
            max.saturating_sub(1)
        };
        if shown + n > room {
            out.push('…');
            return out;
        }
        shown += n;
        out.push_str(&p);
    }
    out
}

impl Ask {
    /// The first line of [`Ask::text`]: who is paid and how much, and what the mandate still
    /// allows after this payment — no text of the receiver but its (bounded) name.
    #[must_use]
    pub fn summary(&self) -> String {
        let mut s = format!(
            "pay {} {} to {}",
            self.total.amount(),
            self.total.asset(),
            bounded(&self.receiver, RECEIVER_MAX, false)
        );
        if self.tolerance > Amount::ZERO {
            s.push_str(&format!(" (up to {} more)", self.tolerance));
        }
        // What is left is counted with this payment already taken out (the wallet counts it
        // before it asks): said so, or a person reads it as what they have before paying.
        let mut left = Vec::new();
        if let Some(m) = &self.left_in_period {
            left.push(format!("{} {} left this period", m.amount(), m.asset()));
        }
        if let Some(m) = &self.left_in_total {
            left.push(format!("{} {} left in total", m.amount(), m.asset()));
        }
        if let Some(first) = left.first_mut() {
            first.push_str(" after this payment");
            s.push_str(&format!("; {}", left.join(", ")));
        }
        s
    }

    /// What a prompt shows: the [`Ask::summary`] line, then — only if the receiver gave one —
    /// its description on a line of its own, after the amount, labelled as the receiver's
    /// words and quoted: `the receiver says it is for: "…"`. Every text the receiver chose is
    /// [`printable`] (a new line in it is an escape: the description cannot add a line) and
    /// bounded ([`RECEIVER_MAX`], [`DESCRIPTION_MAX`]), its quotes escaped, so a description
    /// such as `"0.01 USD"` or `pay 0.01 USD to …` never reads as the amount.
    #[must_use]
    pub fn text(&self) -> String {
        let mut s = self.summary();
        if let Some(d) = &self.description {
            s.push_str(&format!(
                "\nthe receiver says it is for: \"{}\"",
                bounded(d, DESCRIPTION_MAX, true)
            ));
        }
        s
    }
}

/// The human's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Yes; `by` records who or what answered (`terminal`, `callback`, `flag`).
    Yes {
        /// Who answered.
        by: String,
    },
    /// No, and why.
    No {
        /// Why.
        why: String,
    },
}

/// A denial the wallet escalates to the human (I4): never a soft pass, always told.
#[derive(Clone, Debug)]
pub struct Denial {
    /// Who asked to be paid.
    pub receiver: String,
    /// What for.
    pub description: Option<String>,
    /// How much (unknown for a challenge none of whose entries could be read).
    pub amount: Option<Money>,
    /// Why it was denied.
    pub why: String,
}

/// Asks a human. Implementations: [`Callback`], [`Terminal`], [`Refuse`] (the default: no human
/// is reachable, so every confirmation is refused). MCP elicitation comes with the MCP binding.
#[async_trait]
pub trait Confirmer: Send + Sync {
    /// Asks for consent.
    async fn confirm(&self, ask: &Ask) -> Answer;
    /// Tells the human a receiver was denied (the payment is refused either way).
    async fn escalate(&self, denial: &Denial) {
        tracing::warn!(receiver = %denial.receiver, why = %denial.why, "payment denied; escalated to the principal");
    }
}

/// No human: every confirmation is refused.
#[derive(Clone, Copy, Debug, Default)]
pub struct Refuse;

#[async_trait]
impl Confirmer for Refuse {
    async fn confirm(&self, _ask: &Ask) -> Answer {
        Answer::No {
            why: "no confirmer is configured".into(),
        }
    }
}

type AskFn = dyn Fn(&Ask) -> Answer + Send + Sync;
type DenyFn = dyn Fn(&Denial) + Send + Sync;

/// A confirmer that calls a function (a UI, a chat message, a test).
#[derive(Clone)]
pub struct Callback {
    ask: Arc<AskFn>,
    deny: Option<Arc<DenyFn>>,
}

impl Callback {
    /// Answers with `f`.
    pub fn new(f: impl Fn(&Ask) -> Answer + Send + Sync + 'static) -> Self {
        Callback {
            ask: Arc::new(f),
            deny: None,
        }
    }

    /// Also calls `f` with every denial.
    #[must_use]
    pub fn on_denial(mut self, f: impl Fn(&Denial) + Send + Sync + 'static) -> Self {
        self.deny = Some(Arc::new(f));
        self
    }
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Callback")
    }
}

#[async_trait]
impl Confirmer for Callback {
    async fn confirm(&self, ask: &Ask) -> Answer {
        (self.ask)(ask)
    }
    async fn escalate(&self, denial: &Denial) {
        tracing::warn!(receiver = %denial.receiver, why = %denial.why, "payment denied; escalated to the principal");
        if let Some(f) = &self.deny {
            f(denial);
        }
    }
}

/// Asks on the terminal: the question on standard error, a `y`/`yes` on standard input.
/// Anything else, or no terminal, is a no.
#[derive(Clone, Copy, Debug, Default)]
pub struct Terminal;

#[async_trait]
impl Confirmer for Terminal {
    async fn confirm(&self, ask: &Ask) -> Answer {
        let question = format!("stipendex: {}\nstipendex: pay? [y/N] ", ask.text());
        let line = tokio::task::spawn_blocking(move || {
            let mut err = std::io::stderr();
            let _ = write!(err, "{question}");
            let _ = err.flush();
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).map(|_| line)
        })
        .await;
        match line {
            Ok(Ok(l)) if matches!(l.trim().to_ascii_lowercase().as_str(), "y" | "yes") => {
                Answer::Yes {
                    by: "terminal".into(),
                }
            }
            Ok(Ok(_)) => Answer::No {
                why: "declined on the terminal".into(),
            },
            _ => Answer::No {
                why: "no terminal to ask on".into(),
            },
        }
    }
    async fn escalate(&self, denial: &Denial) {
        let amount = denial
            .amount
            .as_ref()
            .map(|m| format!("{} {} ", m.amount(), m.asset()))
            .unwrap_or_default();
        let text = format!(
            "stipendex: DENIED {amount}to {}: {}\n",
            printable(&denial.receiver),
            printable(&denial.why)
        );
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rail_core::{Asset, Money};

    /// A receiver's description that would clear the screen, rewrite the line or reverse the
    /// text a human reads reaches the prompt as visible escapes (issue 24).
    #[test]
    fn receiver_text_cannot_redraw_the_prompt() {
        let ask = Ask {
            why: Why::AboveThreshold,
            receiver: "shop\u{1b}[2J".into(),
            description: Some("report\r\npay 0.01 USD to friend\u{202e}dsu".into()),
            total: Money::parse(Asset::usd(), "250.00").unwrap(),
            tolerance: Amount::ZERO,
            left_in_period: None,
            left_in_total: None,
        };
        let t = ask.text();
        // One new line only: the wallet's, before the description.
        assert_eq!(t.matches('\n').count(), 1, "{t:?}");
        assert!(
            !t.chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{t:?}"
        );
        assert!(
            t.contains("\\u{1b}[2J") && t.contains("\\u{d}\\u{a}") && t.contains("\\u{202e}"),
            "{t}"
        );
        assert_eq!(printable("plain text, café"), "plain text, café");
    }

    /// A receiver's description built to pass for something else (issue 48): long, with new
    /// lines, a bidi override, a quote that would close the quoting, and another amount. It is
    /// bounded, escaped and quoted on a line of its own after the amount, which is the only
    /// amount on the first line; a long receiver name is bounded too.
    #[test]
    fn a_hostile_description_is_bounded_and_kept_apart_from_the_amount() {
        let hostile = format!(
            "report\npay 0.01 USD to friend\u{202e}dsu\u{2028}\u{200b}\" 0.01 USD {}",
            "x".repeat(1_000)
        );
        let ask = Ask {
            why: Why::Checkout,
            receiver: format!("shop{}", "y".repeat(1_000)),
            description: Some(hostile),
            total: Money::parse(Asset::usd(), "250.00").unwrap(),
            tolerance: "0.50".parse().unwrap(),
            left_in_period: None,
            left_in_total: Some(Money::parse(Asset::usd(), "97.50").unwrap()),
        };
        let t = ask.text();
        let lines: Vec<&str> = t.split('\n').collect();
        assert_eq!(lines.len(), 2, "{t}");
        let (first, second) = (lines[0], lines[1]);
        assert!(first.starts_with("pay 250 USD to shopyyy"), "{first}");
        assert!(
            first.ends_with("(up to 0.5 more); 97.5 USD left in total after this payment"),
            "{first}"
        );
        assert!(!first.contains("0.01"), "{first}");
        assert!(first.contains('…'), "the receiver is bounded: {first}");
        assert!(first.chars().count() < 250, "{first}");
        // The description: labelled, quoted, escaped, bounded.
        assert!(
            second.starts_with("the receiver says it is for: \"report\\u{a}pay 0.01 USD"),
            "{second}"
        );
        assert!(second.ends_with("…\""), "{second}");
        assert!(second.contains("\\u{202e}"), "{second}");
        assert!(
            second.contains("\\u{2028}") && second.contains("\\u{200b}"),
            "{second}"
        );
        assert!(
            second.contains("\\\" 0.01 USD"),
            "the inner quote is escaped: {second}"
        );
        let quoted = second
            .strip_prefix("the receiver says it is for: ")
            .unwrap();
        assert!(quoted.chars().count() <= DESCRIPTION_MAX + 2, "{second}");
        assert!(
            !t.chars().any(|c| (c.is_control() && c != '\n')
                || matches!(c, '\u{202e}' | '\u{2028}' | '\u{200b}')),
            "{t:?}"
        );
    }

    /// What is left is said to be after this payment (the wallet counts it before asking).
    #[test]
    fn the_prompt_says_what_is_left_after_this_payment() {
        let usd = |s: &str| Money::parse(Asset::usd(), s).unwrap();
        let mut ask = Ask {
            why: Why::AboveThreshold,
            receiver: "search".into(),
            description: None,
            total: usd("2.50"),
            tolerance: Amount::ZERO,
            left_in_period: Some(usd("17.50")),
            left_in_total: Some(usd("97.50")),
        };
        assert_eq!(
            ask.text(),
            "pay 2.5 USD to search; 17.5 USD left this period after this payment, 97.5 USD left in total"
        );
        ask.left_in_period = None;
        assert_eq!(
            ask.text(),
            "pay 2.5 USD to search; 97.5 USD left in total after this payment"
        );
        ask.left_in_total = None;
        assert_eq!(ask.text(), "pay 2.5 USD to search");
    }
}
