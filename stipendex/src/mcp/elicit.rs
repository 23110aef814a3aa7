//! Human in the loop over MCP: a [`Confirmer`] that asks the host's user through MCP
//! elicitation (`elicitation/create`, form mode) — the UI hosts already have.

use std::time::Duration;

use async_trait::async_trait;
use rmcp::Peer;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{ElicitationMode, RoleServer};
use serde_json::Value;

use crate::wallet::{Answer, Ask, Confirmer, Denial, printable};

/// The field of the form the user answers.
const FIELD: &str = "confirm";

/// How long the user has to answer, by default.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(300);

/// Asks the user of the MCP host on the other end of `peer` (a server's view of its client:
/// a proxy's host, a server's caller) to confirm a payment: the message is the description,
/// the total and what the mandate still allows ([`Ask::text`]); the form has one required
/// boolean, `confirm`. Only an accepted form with `confirm: true` is a yes. A host whose
/// client does not declare elicitation (form mode) is never asked and never paid for: the
/// answer is a no that says so.
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
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: format!("Confirm the payment: {}?", ask.text()),
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
