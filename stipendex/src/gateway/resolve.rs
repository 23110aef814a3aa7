//! Dynamic prices without Rust: `[gateway] resolve_url` is asked for every priced request (the
//! receiver's `resolve_price`, `docs/stipendex-profile.md` §3 and §6c; ContextVM's `resolvePrice`,
//! `docs/research/contextvm-sdk-0.11.14.md` §3.4), with a timeout and a configured failure mode.
//!
//! The gateway `POST`s
//! `{"capability": {"method", "pattern", "price": {"amount"|"estimate","tolerance","asset"}},
//!   "request": {"method", "name", "params", "origin", "client"}}`
//! and reads one of
//! `{"decision": "quote", "amount": "0.07"}` (or `"estimate"` + `"tolerance"`; an optional
//! `"description"`), `{"decision": "reject", "message": "…"}`, `{"decision": "waive"}`. The
//! asset is the entry's: the endpoint sets amounts, not currencies. No answer in time, a
//! non-2xx or anything else is a failure: `resolve_failure = "reject"` (default: refused,
//! nothing charged, nothing forwarded) or `"list_price"` (the entry's price is quoted).

use crate::receiver::{Decision, Price, PricedCapability, Request, ResolvePrice};
use async_trait::async_trait;
use rail_core::Money;
use serde::Deserialize;
use serde_json::json;

use super::{OnFailure, Resolve};
use crate::Error;

/// The largest answer read from the endpoint.
const MAX_ANSWER: usize = 16 * 1024;

/// The remote pricing hook: give it to the receiver's builder (`resolve_price`).
pub struct RemotePrice {
    client: reqwest::Client,
    url: url::Url,
    on_failure: OnFailure,
}

impl RemotePrice {
    /// The hook asking `r`.
    ///
    /// # Errors
    /// [`Error::Gateway`] when its HTTP client cannot start.
    pub fn new(r: &Resolve) -> Result<Self, Error> {
        // The workspace's one TLS provider (an https upstream).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(r.timeout)
            .build()
            .map_err(|e| Error::Gateway(format!("cannot start the resolve_url client: {e}")))?;
        Ok(RemotePrice {
            client,
            url: r.url.clone(),
            on_failure: r.on_failure,
        })
    }

    fn failed(&self, cap: &PricedCapability, why: &str) -> Decision {
        tracing::warn!(why, "resolve_url failed");
        match self.on_failure {
            OnFailure::Reject => {
                Decision::reject("the price of this request cannot be set now: try again later")
            }
            OnFailure::ListPrice => Decision::Quote {
                price: cap.price.clone(),
                description: cap.description.clone(),
                meta: None,
            },
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case", tag = "decision")]
enum Answer {
    Quote {
        amount: Option<String>,
        estimate: Option<String>,
        tolerance: Option<String>,
        description: Option<String>,
    },
    Reject {
        message: String,
    },
    Waive,
}

fn price_json(p: &Price) -> serde_json::Value {
    match p {
        Price::Fixed(m) => json!({"amount": m.amount().to_string(), "asset": m.asset().code()}),
        Price::Estimate {
            estimate,
            tolerance,
        } => json!({
            "estimate": estimate.amount().to_string(),
            "tolerance": tolerance.to_string(),
            "asset": estimate.asset().code(),
        }),
    }
}

/// The decision an answer names, in the entry's asset.
fn decision(cap: &PricedCapability, a: Answer) -> Result<Decision, String> {
    let asset = match &cap.price {
        Price::Fixed(m) => m.asset().clone(),
        Price::Estimate { estimate, .. } => estimate.asset().clone(),
    };
    let money = |v: &str| Money::parse(asset.clone(), v).map_err(|e| format!("{v:?}: {e}"));
    Ok(match a {
        Answer::Waive => Decision::Waive,
        Answer::Reject { message } => Decision::reject(message),
        Answer::Quote {
            amount: Some(a),
            estimate: None,
            tolerance: None,
            description,
        } => Decision::Quote {
            price: Price::Fixed(money(&a)?),
            description,
            meta: None,
        },
        Answer::Quote {
            amount: None,
            estimate: Some(e),
            tolerance: Some(t),
            description,
        } => {
            let price = Price::Estimate {
                estimate: money(&e)?,
                tolerance: money(&t)?.amount(),
            };
            price.max().map_err(|e| e.to_string())?;
            Decision::Quote {
                price,
                description,
                meta: None,
            }
        }
        Answer::Quote { .. } => {
            return Err("a quote names either amount or estimate and tolerance".into());
        }
    })
}

#[async_trait]
impl ResolvePrice for RemotePrice {
    async fn resolve(&self, cap: &PricedCapability, req: &Request) -> Decision {
        let body = json!({
            "capability": {"method": cap.method(), "pattern": cap.name(), "price": price_json(&cap.price)},
            "request": {
                "method": req.method,
                "name": req.name,
                "params": req.params,
                "origin": req.origin,
                "client": req.client,
            },
        });
        let resp = match self.client.post(self.url.clone()).json(&body).send().await {
            Ok(r) => r,
            Err(e) => return self.failed(cap, &e.without_url().to_string()),
        };
        if !resp.status().is_success() {
            return self.failed(cap, &format!("answered {}", resp.status()));
        }
        // Read at most MAX_ANSWER bytes: a larger answer is refused as it streams, never
        // held whole.
        let mut resp = resp;
        let mut bytes = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) if bytes.len() + c.len() <= MAX_ANSWER => bytes.extend_from_slice(&c),
                Ok(Some(_)) => return self.failed(cap, "the answer is too large"),
                Ok(None) => break,
                Err(e) => return self.failed(cap, &e.without_url().to_string()),
            }
        }
        match serde_json::from_slice::<Answer>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|a| decision(cap, a))
        {
            Ok(d) => d,
            Err(why) => self.failed(cap, &why),
        }
    }
}
