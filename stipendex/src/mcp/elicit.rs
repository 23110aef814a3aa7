//! Human in the loop over MCP: a [`Confirmer`] that asks the host's user through MCP
//! elicitation (`elicitation/create`, form mode) — the UI hosts already have.

use std::time::Duration;

use async_trait::async_trait;
use rmcp::Peer;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema, RequestMetaObject};
use rmcp::service::{ElicitationMode, RoleServer};
use serde_json::Value;
#[cfg(feature = "mcp-client")]
use unicode_normalization::UnicodeNormalization as _;

use super::{ORIGIN, WALLET, WALLET_PREFIX};

use crate::wallet::{Answer, Ask, Confirmer, Denial, printable};

/// The field of the form the user answers.
const FIELD: &str = "confirm";

/// How long the user has to answer, by default.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(300);

/// Asks the user of the MCP host on the other end of `peer` (a server's view of its client:
/// a proxy's host, a server's caller) to confirm a payment: the message is
/// `[Stipendex wallet] Confirm the payment: ` then the total, what the mandate still allows
/// and, on a line of its own, the receiver's quoted description ([`Ask::text`]); the request's
/// `_meta` carries the wallet's mark (`"stipendex/origin": "wallet"`, [`super::ORIGIN`]); the
/// form has one required boolean, `confirm`. Only an accepted form with `confirm: true` is a
/// yes. A host whose client does not declare elicitation (form mode) is never asked and never
/// paid for: the answer is a no that says so.
#[derive(Clone)]
pub struct Elicit {
    peer: Peer<RoleServer>,
    within: Duration,
}

impl std::fmt::Debug for Elicit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elicit")
            .field("within", &self.within)
            .finish_non_exhaustive()
    }
}

impl Elicit {
    /// Asks through `peer`, waiting [`ANSWER_WITHIN`] for an answer.
    #[must_use]
    pub fn new(peer: Peer<RoleServer>) -> Self {
        Elicit {
            peer,
            within: ANSWER_WITHIN,
        }
    }

    /// Waits `within` for an answer (then: no).
    #[must_use]
    pub fn within(mut self, within: Duration) -> Self {
        self.within = within;
        self
    }

    /// Whether the host can be asked at all.
    #[must_use]
    pub fn can_ask(&self) -> bool {
        self.peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
    }
}

fn no(why: impl Into<String>) -> Answer {
    Answer::No { why: why.into() }
}

#[async_trait]
impl Confirmer for Elicit {
    async fn confirm(&self, ask: &Ask) -> Answer {
        if !self.can_ask() {
            return no(
                "the host cannot ask its user: its MCP client does not offer elicitation, so a payment that needs a confirmation is not made",
            );
        }
        let schema = ElicitationSchema::builder()
            .required_bool_with(FIELD, |b| {
                b.title("Confirm this payment")
                    .description("true to pay; false or decline to refuse")
            })
            .build_unchecked();
        let mut mark = RequestMetaObject::new();
        mark.insert(ORIGIN.to_owned(), Value::String(WALLET.to_owned()));
        let params = ElicitRequestParams::FormElicitationParams {
            meta: Some(mark),
            message: format!("{WALLET_PREFIX} Confirm the payment: {}", ask.text()),
            requested_schema: schema,
        };
        match self
            .peer
            .create_elicitation_with_timeout(params, Some(self.within))
            .await
        {
            Ok(r) => match r.action {
                ElicitationAction::Accept => {
                    let yes = r
                        .content
                        .as_ref()
                        .and_then(|c| c.get(FIELD))
                        .and_then(Value::as_bool)
                        == Some(true);
                    if yes {
                        Answer::Yes {
                            by: "mcp-elicitation".into(),
                        }
                    } else {
                        no("the user did not confirm the payment")
                    }
                }
                ElicitationAction::Decline => no("the user declined the payment"),
                _ => no("the user dismissed the confirmation"),
            },
            Err(e) => no(format!("the host could not ask its user: {e}")),
        }
    }

    async fn escalate(&self, denial: &Denial) {
        tracing::warn!(receiver = %printable(&denial.receiver), why = %denial.why, "payment denied by the mandate; the host's tool error says why");
    }
}

/// What a dialog of the server behind the proxy may not contain, as [`folded`]: the wallet's
/// prefix (`[Stipendex wallet]`) and its confirmation phrases.
#[cfg(feature = "mcp-client")]
const WALLET_PHRASES: &[&str] = &[
    "stipendexwallet",
    "confirmthepayment",
    "confirmthispayment",
    "confirmpayment",
];

/// What a dialog of the server behind the proxy may not start with, as [`folded`]: the name
/// the wallet's prompts start with (`[Stipendex wallet]`, the terminal's `stipendex:`).
#[cfg(feature = "mcp-client")]
const WALLET_NAME: &str = "stipendex";

/// `s` as compared with the wallet's phrases: compatibility-decomposed (fullwidth, styled and
/// accented letters become plain ones), lower case, Cyrillic and Greek letters that look Latin
/// read as Latin, and only letters and digits kept (spaces, punctuation, invisible characters
/// and combining marks dropped).
#[cfg(feature = "mcp-client")]
fn folded(s: &str) -> String {
    s.nfkd()
        .flat_map(char::to_lowercase)
        .map(latin_lookalike)
        .filter(|c| c.is_alphanumeric())
        .collect()
}

/// The Latin letter a Cyrillic or Greek (lower-case) letter passes for, or `c`.
#[cfg(feature = "mcp-client")]
fn latin_lookalike(c: char) -> char {
    match c {
        'а' | 'α' => 'a',
        'в' | 'β' => 'b',
        'с' | 'ϲ' => 'c',
        'ԁ' => 'd',
        'е' | 'ε' => 'e',
        'һ' | 'н' | 'η' => 'h',
        'і' | 'ι' | 'ӏ' => 'i',
        'ј' => 'j',
        'к' | 'κ' => 'k',
        'м' | 'μ' => 'm',
        'ν' => 'v',
        'о' | 'ο' | 'σ' => 'o',
        'р' | 'ρ' => 'p',
        'ѕ' => 's',
        'т' | 'τ' => 't',
        'у' | 'υ' | 'γ' => 'y',
        'х' | 'χ' => 'x',
        'ԝ' | 'ω' => 'w',
        'ζ' => 'z',
        'п' | 'π' => 'n',
        other => other,
    }
}

/// Whether `text` contains the wallet's prefix or confirmation phrases ("Confirm the
/// payment"), whatever its case, spacing, punctuation, lookalike letters or invisible
/// characters: a server's name that does is refused its dialogs.
#[cfg(feature = "mcp-client")]
pub(crate) fn names_the_wallet(text: &str) -> bool {
    let f = folded(text);
    WALLET_PHRASES.iter().any(|p| f.contains(p))
}

/// Whether a dialog's text (its message, then its form or URL) reads like the wallet's own:
/// [`names_the_wallet`], or it starts as the wallet's prompts do (`Stipendex…`).
#[cfg(feature = "mcp-client")]
pub(crate) fn imitates_wallet(text: &str) -> bool {
    names_the_wallet(text) || folded(text).starts_with(WALLET_NAME)
}

#[cfg(all(test, feature = "mcp-client"))]
mod tests {
    use super::*;

    #[test]
    fn the_wallets_phrases_are_found_under_lookalikes() {
        for t in [
            "Confirm the payment: pay 1 USD",
            "[Stipendex wallet] …",
            "CONFIRM  THE\nPAYMENT",
            "\u{ff23}onfirm th\u{435} p\u{430}y\u{200b}ment",
            "\u{1d402}\u{1d428}\u{1d427}\u{1d41f}\u{1d422}\u{1d42b}\u{1d426} payment",
            "c.o.n.f.i.r.m t-h-e p_a_y_m_e_n_t",
            "Stіpendex",
        ] {
            assert!(imitates_wallet(t), "{t:?}");
        }
        for t in [
            "Which city?",
            "Confirm the booking",
            "Payment method?",
            "pay 0.01 USD",
            "This tool is paid through Stipendex. Which city?",
        ] {
            assert!(!imitates_wallet(t), "{t:?}");
        }
        // A server's name: its own, even Stipendex-made, but not the wallet's.
        assert!(!names_the_wallet("stipendex-example"));
        assert!(names_the_wallet("Stipendex Wallet"));
        assert!(names_the_wallet("confirm-the-payment"));
    }
}
