//! Unsigned challenges of today's protocols, paid under the same mandate (feature
//! `challenges`): an x402 402 over HTTP (v2 `PAYMENT-REQUIRED`, or a v1 body) and an x402-style
//! MCP tool result with `isError` (the x402 MCP convention, and exact-algo's:
//! `docs/exact-algo.md` §5; `docs/stipendex-profile.md` §5).
//!
//! They carry no signature, so the allowlist is keyed by where they come from — the HTTP
//! origin or the MCP server's identity — *and* the `payTo` of the entry paid
//! ([`crate::envelope::Allow::X402Http`], [`crate::envelope::Allow::X402Mcp`]); the limits and the
//! confirmation threshold apply as to a Quote. The payment is signed by one of the wallet's
//! [`SchemePayer`]s, and the audit chain records a Proof whose `challenge` holds what the
//! wallet saw (no Quote, and no Receipt: the server's `PAYMENT-RESPONSE` is not signed).

use std::sync::Arc;

use rail_core::{Money, OpId, Payment, PaymentMode, RailId};
use serde_json::Value;
use x402_transport::client::{self, PayPolicy, Required, SchemePayer, Sent};

use super::unsigned::Unsigned;
use super::{Wallet, deny, now_secs, rail_allowed};
use crate::Error;
use crate::envelope::{Challenge, ChallengeSource, Confirmation, Proof, Signed};

/// Where a challenge came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    kind: ChallengeSource,
    origin: String,
}

impl Source {
    /// The origin of `url` (`https://host[:port]`, lower case, the default port dropped), as
    /// the `url` crate parses it — the parser reqwest connects with, so the origin allowlisted
    /// is the origin the request reaches (`http://evil.example\@api.example/x` is
    /// `http://evil.example`: WHATWG URLs end the authority at `\` too).
    ///
    /// # Errors
    /// [`Error::Malformed`] if `url` is not an absolute http(s) URL with a host.
    pub fn http(url: &str) -> Result<Self, Error> {
        Ok(Source {
            kind: ChallengeSource::Http,
            origin: crate::origin::of_url(url)?,
        })
    }

    /// An MCP server, by the identity the host knows it by (its URL, or its name).
    #[must_use]
    pub fn mcp(server: impl Into<String>) -> Self {
        Source {
            kind: ChallengeSource::Mcp,
            origin: server.into(),
        }
    }

    /// The origin or server.
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

/// A challenge the wallet paid: what to send back, and its Proof for the audit.
#[derive(Clone, Debug)]
pub struct ChallengePaid {
    /// The HTTP header to retry with (`PAYMENT-SIGNATURE`, or `X-PAYMENT` for v1).
    pub header: &'static str,
    /// Its value (base64 of the envelope).
    pub value: String,
    /// The payment envelope (for MCP: the value of `params._meta["x402/payment"]`).
    pub envelope: Value,
    /// The amount signed for.
    pub amount: Money,
    /// The label of the scheme payer that signed (`exact-evm`, `exact-algo`).
    pub payer: String,
    /// The Proof recorded in the audit chain.
    pub proof: Signed<Proof>,
    /// The human's Confirmation, if one was needed.
    pub confirmation: Option<Signed<Confirmation>>,
}

impl ChallengePaid {
    /// The `_meta` key an MCP retry carries the envelope under.
    pub const MCP_META: &'static str = "x402/payment";

    /// The payment as the x402 client delivers it ([`x402_transport::client::Client::resend`]:
    /// the same bytes again while the outcome is unknown).
    #[must_use]
    pub fn sent(&self) -> Sent {
        Sent {
            label: self.payer.clone(),
            envelope: self.envelope.clone(),
            v1: self.header == x402_transport::wire::X_PAYMENT,
        }
    }
}

/// The entry a payer chose, with what the mandate needs to know of it.
struct Choice<'a> {
    payer: &'a Arc<dyn SchemePayer>,
    entry: Value,
    amount: Money,
    challenge: Challenge,
}

/// The wallet's say beside each payer's policy: an entry is paid only if the payer can tell
/// its asset and amount (the mandate's limits are in an asset).
#[derive(Debug)]
struct KnownAmount;

impl PayPolicy for KnownAmount {
    fn refusal(&self, payer: &dyn SchemePayer, entry: &Value) -> Option<String> {
        (payer.asset(entry).is_none() || payer.amount(entry).is_none())
            .then(|| "cannot tell the entry's asset or amount".to_owned())
    }
}

impl Wallet {
    /// Pays an unsigned x402 challenge from `source` under the mandate: allowlist (origin or
    /// server, and `payTo`; a denial is escalated), mandate validity and revocation, limits,
    /// the confirmation threshold; then one of the wallet's scheme payers signs the cheapest
    /// allowed entry it accepts.
    ///
    /// # Errors
    /// [`Error::Denied`], [`Error::Revoked`], [`Error::Expired`] (mandate),
    /// [`Error::LimitExceeded`], [`Error::NotConfirmed`], [`Error::NoRail`] (no scheme payer
    /// accepts an allowed entry), [`Error::Payment`] (signing failed; nothing counted).
    pub async fn pay_challenge(
        &self,
        source: &Source,
        required: &Required,
    ) -> Result<ChallengePaid, Error> {
        self.challenge_with(source, required, self.0.confirmer.as_ref())
            .await
    }

    /// [`Wallet::pay_challenge`] asking `confirmer` (and telling it of a denial).
    pub(super) async fn challenge_with(
        &self,
        source: &Source,
        required: &Required,
        confirmer: &dyn super::Confirmer,
    ) -> Result<ChallengePaid, Error> {
        let me = &self.0;
        let mandate = me.mandate.object();
        let now = now_secs(&me.clock);
        let entries = required.entries();
        let challenge = |entry: &Value| Challenge {
            source: source.kind,
            origin: source.origin.clone(),
            pay_to: entry
                .get("payTo")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            entry: entry.clone(),
        };
        let allowed: Vec<Value> = entries
            .iter()
            .filter(|e| crate::chain::challenge_allowed(&mandate.allow, &challenge(e)))
            .cloned()
            .collect();
        if allowed.is_empty() {
            let pay_to: Vec<String> = entries.iter().map(|e| challenge(e).pay_to).collect();
            let why = format!(
                "{} (paying {}) is not in mandate {}'s allowlist",
                source.origin,
                pay_to.join(" or "),
                mandate.id
            );
            let receiver = source.origin.clone();
            return Err(deny(confirmer, receiver, None, None, why).await);
        }
        self.check_mandate(now).await?;
        // Only payers over a rail the mandate allows (`rails`; absent: any the wallet has).
        let payers: Vec<Arc<dyn client::SchemePayer>> = me
            .scheme_payers
            .iter()
            .filter(|p| rail_allowed(mandate, p.rail()))
            .cloned()
            .collect();
        if payers.is_empty() && !me.scheme_payers.is_empty() {
            let kinds: Vec<&str> = me.scheme_payers.iter().map(|p| p.rail()).collect();
            return Err(Error::Denied(format!(
                "mandate {} does not allow paying over {} (its rails: {})",
                mandate.id,
                kinds.join(" or "),
                mandate.rails.as_deref().unwrap_or_default().join(", ")
            )));
        }
        let choice = self.choose_entry(&payers, &allowed, &challenge)?;
        let unsigned = Unsigned {
            challenge: choice.challenge,
            amount: choice.amount.clone(),
            op: OpId::random(),
            payee: &source.origin,
            what: "x402",
            key: None,
        };
        let label = choice.payer.label().to_owned();
        let (payer, entry) = (choice.payer, &choice.entry);
        let paid = self
            .pay_unsigned(unsigned, now, confirmer, || async {
                // Nothing is signed unless this succeeds: a failure moves nothing.
                let sent = client::sign(payer.as_ref(), required, entry)
                    .await
                    .map_err(|e| {
                        let why = match e {
                            client::ClientError::Payer(why) => why,
                            e => e.to_string(),
                        };
                        rail_core::RailError::Declined(rail_core::RailReason::new("sign", why))
                    })?;
                let payment = Payment {
                    rail: RailId::new(label.clone()),
                    offer_id: "x402".into(),
                    mode: PaymentMode::Capture,
                    payer: String::new(),
                    amount: choice.amount.clone(),
                    proof: sent.envelope.clone(),
                };
                Ok((payment, sent))
            })
            .await?;
        let sent = paid.extra;
        let value = sent
            .header_value()
            .map_err(|e| Error::Malformed(format!("cannot encode the payment: {e}")))?;
        let (header, envelope, proof) = (sent.header_name(), sent.envelope, paid.proof);
        let confirmation = paid.confirmation;
        tracing::info!(origin = %source.origin, amount = %choice.amount.amount(), asset = %choice.amount.asset(), payer = %label, "signed an x402 payment");
        Ok(ChallengePaid {
            header,
            value,
            envelope,
            amount: choice.amount,
            payer: label,
            proof,
            confirmation,
        })
    }

    /// The first scheme payer (in the wallet's order) that accepts an allowed entry, and the
    /// cheapest entry it accepts: the x402 client's [`client::choose`], under the payers'
    /// policies and the wallet's [`KnownAmount`].
    fn choose_entry<'a>(
        &self,
        payers: &'a [Arc<dyn client::SchemePayer>],
        allowed: &[Value],
        challenge: &dyn Fn(&Value) -> Challenge,
    ) -> Result<Choice<'a>, Error> {
        let (payer, entry) =
            client::choose(payers, allowed, Some(&KnownAmount)).map_err(|e| match e {
                client::ClientError::NothingPayable(why) => Error::NoRail(format!(
                    "no scheme payer accepts an allowed entry: {}",
                    why.join("; ")
                )),
                e => Error::NoRail(e.to_string()),
            })?;
        let (Some(asset), Some(units)) = (payer.asset(&entry), payer.amount(&entry)) else {
            return Err(Error::NoRail(format!(
                "{}: cannot tell the entry's asset or amount",
                payer.label()
            )));
        };
        let amount = Money::from_minor(asset, units)
            .map_err(|e| Error::Malformed(format!("the 402's amount: {e}")))?;
        Ok(Choice {
            payer,
            challenge: challenge(&entry),
            entry,
            amount,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_normalised() {
        let o = |u: &str| {
            Source::http(u)
                .map(|s| s.origin)
                .unwrap_or_else(|e| e.to_string())
        };
        assert_eq!(
            o("https://API.example.com:443/x?y"),
            "https://api.example.com"
        );
        assert_eq!(o("http://127.0.0.1:8080/weather"), "http://127.0.0.1:8080");
        assert_eq!(o("http://user@host:80"), "http://host");
        assert!(Source::http("ftp://host").is_err());
        assert!(Source::http("/relative").is_err());
    }

    /// A URL whose authority a naive split reads as the allowlisted host while the connection
    /// goes elsewhere: the origin is where the request is sent (issue 23, URL tricks).
    #[test]
    fn the_origin_is_where_the_request_goes() {
        let o = |u: &str| {
            Source::http(u)
                .map(|s| s.origin)
                .unwrap_or_else(|e| e.to_string())
        };
        assert_eq!(
            o("http://evil.example\\@api.allowed.com/x"),
            "http://evil.example"
        );
        assert_eq!(
            reqwest_host("http://evil.example\\@api.allowed.com/x"),
            "evil.example",
            "the URL parser the client connects with agrees"
        );
        assert_eq!(
            o("http://api.allowed.com%2f@evil.example/"),
            "http://evil.example"
        );
        assert_eq!(o("HTTP://API.Allowed.COM:80/x"), "http://api.allowed.com");
        assert!(Source::http("data:text/plain,x").is_err());
    }

    fn reqwest_host(u: &str) -> String {
        url::Url::parse(u)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default()
    }

    #[test]
    fn mcp_results_are_read_in_the_conventions_order() {
        let required = serde_json::json!({"x402Version": 2, "accepts": [{"scheme": "exact"}]});
        let structured = serde_json::json!({"isError": true, "structuredContent": required});
        assert!(matches!(
            Required::from_mcp_result(&structured),
            Some(Required::V2(_))
        ));
        let text = serde_json::json!({"isError": true, "content": [{"type": "text", "text": required.to_string()}]});
        assert!(matches!(
            Required::from_mcp_result(&text),
            Some(Required::V2(_))
        ));
        let nested = serde_json::json!({"isError": true, "structuredContent": {"x402/error": {"data": required}}});
        assert!(Required::from_mcp_result(&nested).is_some());
        let ok = serde_json::json!({"isError": false, "structuredContent": required});
        assert!(Required::from_mcp_result(&ok).is_none());
    }
}
