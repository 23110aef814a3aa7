//! What a receiver charges for: priced capabilities (method + name, explicit wildcards) and the
//! `resolve_price` hook that quotes, rejects or waives each priced request.

use async_trait::async_trait;
use rail_core::route::{PathMatching, RoutePattern, decoded_segments, most_specific_as};
use rail_core::{Amount, Money};
use serde_json::{Value, json};

use crate::envelope::Digest;

/// A request as the receiver sees it: where it was served, the capability called and its
/// arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// The receiver's public origin the request was served at (over HTTP, chosen from the
    /// receiver's configured origins, never taken from the `Host` header); `None` in process.
    /// It is part of the request digest, and the Quote names it.
    pub origin: Option<String>,
    /// The method (`tools/call`, `resources/read`, `GET`, `POST`).
    pub method: String,
    /// The name (a tool name, a resource URI, a path).
    pub name: String,
    /// The arguments (a tool call's `arguments`, a query string as an object); `Null` if none.
    pub params: Value,
    /// The query as received (HTTP), for the Quote's resource; `params` holds it parsed.
    pub query: Option<String>,
    /// Who calls, if the transport knows (a client key, an origin); the hook may use it.
    pub client: Option<String>,
}

impl Request {
    /// A request for `method` + `name` with no arguments.
    #[must_use]
    pub fn new(method: impl Into<String>, name: impl Into<String>) -> Self {
        Request {
            origin: None,
            method: method.into(),
            name: name.into(),
            params: Value::Null,
            query: None,
            client: None,
        }
    }

    /// Served at `origin` (`https://host[:port]`).
    #[must_use]
    pub fn at(mut self, origin: impl Into<String>) -> Self {
        self.origin = Some(origin.into());
        self
    }

    /// With arguments.
    #[must_use]
    pub fn with_params(mut self, params: Value) -> Self {
        self.params = params;
        self
    }

    /// The digest a Quote binds: SHA-256 of `{"method", "name", "origin", "params"}` as JSON
    /// with sorted keys (`origin` only when the request has one), so the Quote pays for this
    /// request, where it was served, and no other.
    #[must_use]
    pub fn digest(&self) -> Digest {
        // serde_json's map is a BTreeMap here (no `preserve_order`): keys come out sorted.
        let mut v = json!({"method": self.method, "name": self.name, "params": self.params});
        if let (Some(o), Some(m)) = (&self.origin, v.as_object_mut()) {
            m.insert("origin".into(), Value::String(o.clone()));
        }
        Digest::of(v.to_string().as_bytes())
    }

    /// The request an HTTP call of `r` is to a receiver (what the HTTP binding makes of it):
    /// for a wallet, the request its voucher or Quote must bind.
    #[must_use]
    pub fn from_resource(r: &crate::envelope::Resource) -> Self {
        Request {
            origin: Some(r.origin.clone()),
            method: r.method.clone(),
            name: r.path.clone(),
            params: query_params(r.query.as_deref()),
            query: r.query.clone(),
            client: None,
        }
    }

    /// The request in the clear, as a Quote names it (`None` without an origin).
    #[must_use]
    pub fn resource(&self) -> Option<crate::envelope::Resource> {
        self.origin.as_ref().map(|o| crate::envelope::Resource {
            origin: o.clone(),
            method: self.method.clone(),
            path: self.name.clone(),
            query: self.query.clone(),
        })
    }
}

/// An HTTP query as the request's parameters: an object (a repeated key becomes an array), or
/// `Null` without one.
pub(crate) fn query_params(query: Option<&str>) -> Value {
    let mut params = serde_json::Map::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let v = Value::String(v.into_owned());
        match params.get_mut(k.as_ref()) {
            None => {
                params.insert(k.into_owned(), v);
            }
            Some(Value::Array(a)) => a.push(v),
            Some(prev) => {
                let first = prev.take();
                *prev = Value::Array(vec![first, v]);
            }
        }
    }
    if params.is_empty() {
        Value::Null
    } else {
        Value::Object(params)
    }
}

/// A price.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Price {
    /// A fixed amount (service profile).
    Fixed(Money),
    /// An estimate and how far above it the final amount may go (checkout profile: held, then
    /// captured for the final amount).
    Estimate {
        /// The estimate.
        estimate: Money,
        /// The tolerance, in the estimate's asset.
        tolerance: Amount,
    },
}

impl Price {
    /// The asset it is in.
    #[must_use]
    pub fn asset(&self) -> &rail_core::Asset {
        match self {
            Price::Fixed(m) => m.asset(),
            Price::Estimate { estimate, .. } => estimate.asset(),
        }
    }

    /// The most it can cost.
    ///
    /// # Errors
    /// [`crate::Error::Malformed`] if estimate + tolerance does not fit the asset.
    pub fn max(&self) -> Result<Money, crate::Error> {
        match self {
            Price::Fixed(m) => Ok(m.clone()),
            Price::Estimate {
                estimate,
                tolerance,
            } => estimate
                .amount()
                .checked_add(*tolerance)
                .and_then(|a| Money::new(estimate.asset().clone(), a))
                .map_err(|e| crate::Error::Malformed(format!("estimate + tolerance: {e}"))),
        }
    }
}

/// A priced capability: requests whose method is `method` and whose name (an HTTP path, a tool
/// name, a resource URI) matches the pattern `name` are gated.
///
/// `name` is a pattern of the one syntax of [`rail_core::route`], shared with the x402
/// paywall and every gate: `{id}` one segment, `{*rest}` the non-empty rest, a final `*` a
/// prefix (`private://*`, `search_*`; `*` alone: every name), anything else literal; names are
/// percent-decoded segment by segment before they are compared. The most specific match wins
/// (a literal over a prefix over `{id}` over `{*rest}`; the first declared among equals).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PricedCapability {
    method: String,
    pattern: RoutePattern,
    /// The list price (the hook may change it).
    pub price: Price,
    /// What it is, for the Quote's description.
    pub description: Option<String>,
}

impl PricedCapability {
    /// Whether the hook's `decision` kept this capability's list price: an x402 route beside
    /// it is priced at the list price (x402's `exact` carries no price of its own), so it is
    /// offered and taken only then — never to pay around the hook's refusal, waiver or other
    /// price.
    #[must_use]
    pub fn list_price_kept(&self, decision: &Decision) -> bool {
        matches!(decision, Decision::Quote { price, .. } if *price == self.price)
    }

    /// Whether `quote` (the hook's Quote for a request under this capability) asks this
    /// capability's fixed list price, as [`PricedCapability::list_price_kept`] asks of a
    /// decision.
    #[must_use]
    pub fn quoted_at_list_price(&self, quote: &crate::envelope::Quote) -> bool {
        matches!(&self.price, Price::Fixed(m)
            if quote.estimate.is_none()
                && quote.amount == Some(m.amount())
                && &quote.asset == m.asset())
    }

    /// A capability at a fixed price.
    #[must_use]
    pub fn fixed(method: impl Into<String>, name: impl AsRef<str>, price: Money) -> Self {
        PricedCapability {
            method: method.into(),
            pattern: RoutePattern::parse(name.as_ref()),
            price: Price::Fixed(price),
            description: None,
        }
    }

    /// A capability priced by estimate and tolerance (checkout profile).
    #[must_use]
    pub fn estimate(
        method: impl Into<String>,
        name: impl AsRef<str>,
        estimate: Money,
        tolerance: Amount,
    ) -> Self {
        PricedCapability {
            method: method.into(),
            pattern: RoutePattern::parse(name.as_ref()),
            price: Price::Estimate {
                estimate,
                tolerance,
            },
            description: None,
        }
    }

    /// With a description.
    #[must_use]
    pub fn describe(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// The method priced (`GET`, `tools/call`).
    #[must_use]
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The name pattern, as written (`/api/posts/{id}`, `private://*`).
    #[must_use]
    pub fn name(&self) -> &str {
        self.pattern.as_str()
    }

    /// The parsed pattern.
    #[must_use]
    pub fn pattern(&self) -> &RoutePattern {
        &self.pattern
    }
}

/// The one pricing decision, exactly ([`PathMatching::Strict`]): what a wallet and a verifier
/// use to price a call inside a tab (a voucher the receiver accepted was priced the same both
/// ways: a spelling the two would price apart is refused as `wrong_price`).
pub(crate) fn matching<'a>(
    caps: &'a [PricedCapability],
    req: &Request,
) -> Option<&'a PricedCapability> {
    matching_as(caps, req, PathMatching::Strict)
}

/// How a name is compared under the receiver's `mode`: an HTTP path (a name starting with `/`)
/// as the mode says; a tool name or a resource URI exactly, as MCP names are.
fn mode_for(name: &str, mode: PathMatching) -> PathMatching {
    if name.starts_with('/') {
        mode
    } else {
        PathMatching::Strict
    }
}

/// The one pricing decision: the most specific capability priced for `req`'s method whose
/// pattern matches its percent-decoded name under `mode` (HTTP paths; other names exactly); a
/// `HEAD` is priced as the `GET` of the same name (it shows what a GET would, so it is never
/// free where the GET is priced).
pub(crate) fn matching_as<'a>(
    caps: &'a [PricedCapability],
    req: &Request,
    mode: PathMatching,
) -> Option<&'a PricedCapability> {
    let decoded = decoded_segments(&req.name);
    let mode = mode_for(&req.name, mode);
    let by = |method: &str| {
        most_specific_as(
            caps.iter()
                .filter(|c| c.method == method)
                .map(|c| (&c.pattern, c)),
            &decoded,
            mode,
        )
    };
    by(&req.method).or_else(|| (req.method == "HEAD").then(|| by("GET")).flatten())
}

/// The methods of the capabilities whose pattern matches `name` under `mode` (each once,
/// declared order).
pub(crate) fn methods_matching<'a>(
    caps: &'a [PricedCapability],
    name: &str,
    mode: PathMatching,
) -> Vec<&'a str> {
    let decoded = decoded_segments(name);
    let mode = mode_for(name, mode);
    let mut out: Vec<&str> = Vec::new();
    for c in caps {
        if c.pattern.matches_as(&decoded, mode) && !out.contains(&c.method.as_str()) {
            out.push(&c.method);
        }
    }
    out
}

/// What `resolve_price` decided for one priced request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Quote this price.
    Quote {
        /// The price.
        price: Price,
        /// Why this price (goes into the Quote's description).
        description: Option<String>,
        /// Extra data for the client, passed on by bindings that carry it (ContextVM's CEP-8:
        /// merged into the `_meta` of `payment_required`, over the processor's own keys, as the
        /// SDK's `resolvePrice` `meta`); `None` for none.
        meta: Option<serde_json::Map<String, Value>>,
    },
    /// Refuse without charging: no Quote, nothing forwarded.
    Reject {
        /// Why (shown to the caller).
        message: String,
    },
    /// Let the request through without payment (prepaid, subscription).
    Waive,
}

impl Decision {
    /// Quote `price`.
    #[must_use]
    pub fn quote(price: Price) -> Self {
        Decision::Quote {
            price,
            description: None,
            meta: None,
        }
    }

    /// This decision with `meta` for the client (a quote only; anything else is unchanged).
    #[must_use]
    pub fn with_meta(self, meta: serde_json::Map<String, Value>) -> Self {
        match self {
            Decision::Quote {
                price, description, ..
            } => Decision::Quote {
                price,
                description,
                meta: Some(meta),
            },
            other => other,
        }
    }

    /// Reject with `message`.
    #[must_use]
    pub fn reject(message: impl Into<String>) -> Self {
        Decision::Reject {
            message: message.into(),
        }
    }
}

/// The pricing hook: runs on every priced request and decides its price. Keep it fast and
/// deterministic; it is authorisation as much as pricing. State it keeps (quotas, prepaid
/// balances) belongs in a durable store when several receivers run.
#[async_trait]
pub trait ResolvePrice: Send + Sync {
    /// The decision for `req`, which matched `capability`.
    async fn resolve(&self, capability: &PricedCapability, req: &Request) -> Decision;
}

/// The default hook: the capability's list price.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListPrice;

#[async_trait]
impl ResolvePrice for ListPrice {
    async fn resolve(&self, capability: &PricedCapability, _req: &Request) -> Decision {
        Decision::Quote {
            price: capability.price.clone(),
            description: capability.description.clone(),
            meta: None,
        }
    }
}

#[async_trait]
impl<F> ResolvePrice for F
where
    F: Fn(&PricedCapability, &Request) -> Decision + Send + Sync,
{
    async fn resolve(&self, capability: &PricedCapability, req: &Request) -> Decision {
        self(capability, req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rail_core::Asset;

    #[test]
    fn exact_beats_prefix_beats_star() {
        let usd = |s| Money::parse(Asset::usd(), s).unwrap();
        let caps = vec![
            PricedCapability::fixed("tools/call", "*", usd("1.00")),
            PricedCapability::fixed("tools/call", "search*", usd("0.50")),
            PricedCapability::fixed("tools/call", "search_web", usd("0.05")),
            PricedCapability::fixed("resources/read", "private://*", usd("0.10")),
        ];
        let price = |m: &str, n: &str| {
            matching(&caps, &Request::new(m, n)).map(|c| match &c.price {
                Price::Fixed(p) => p.amount().to_string(),
                Price::Estimate { .. } => "est".into(),
            })
        };
        assert_eq!(price("tools/call", "search_web").as_deref(), Some("0.05"));
        assert_eq!(price("tools/call", "search_img").as_deref(), Some("0.5"));
        assert_eq!(price("tools/call", "add").as_deref(), Some("1"));
        assert_eq!(
            price("resources/read", "private://x").as_deref(),
            Some("0.1")
        );
        assert_eq!(price("resources/read", "public://x"), None);
        // HEAD is priced as GET; another method is not.
        let get = vec![PricedCapability::fixed(
            "GET",
            "/api/posts/{id}",
            usd("0.10"),
        )];
        assert!(matching(&get, &Request::new("HEAD", "/api/posts/%31")).is_some());
        assert!(matching(&get, &Request::new("GET", "/api/posts/%31")).is_some());
        assert!(matching(&get, &Request::new("POST", "/api/posts/1")).is_none());
    }

    #[test]
    fn request_digest_ignores_key_order_but_not_values() {
        let a = Request::new("GET", "/x").with_params(json!({"a": "1", "b": "2"}));
        let b = Request::new("GET", "/x").with_params(json!({"b": "2", "a": "1"}));
        let c = Request::new("GET", "/x").with_params(json!({"a": "1", "b": "3"}));
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
    }
}
