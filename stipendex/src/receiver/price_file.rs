//! The pricing file: what a receiver charges for, as `[[price]]` entries of its TOML
//! configuration — the one format and the one parser of `stipendex serve-mcp` and the gateway.
//!
//! ```toml
//! [[price]]
//! kind = "tool"                 # tool | resource | prompt | route
//! pattern = "search_*"          # the one pattern syntax (rail_core::route)
//! amount = "0.005"              # service profile: a fixed amount…
//! asset = "USDC"
//! description = "one web search"
//!
//! [[price]]
//! kind = "tool"
//! pattern = "render"
//! profile = "checkout"          # …or checkout: an estimate and a tolerance
//! estimate = "1.00"
//! tolerance = "0.50"
//! asset = "USD"
//!
//! [[price]]
//! kind = "resource"
//! pattern = "reports://*"
//! amount = "0.02"
//! asset = "USD"
//!
//! [[price]]
//! kind = "route"                # an HTTP route: its method is required
//! method = "GET"
//! pattern = "/api/posts/{id}"
//! amount = "0.10"
//! asset = "USD"
//! ```
//!
//! `kind` names the method priced: `tool` is `tools/call`, `resource` is `resources/read`,
//! `prompt` is `prompts/get`; a `route` names its HTTP `method`. `profile` defaults to
//! `service` with `amount`, and to `checkout` with `estimate` + `tolerance`; naming one that
//! contradicts the amounts given is an error, as are an amount more precise than its asset, an
//! unknown asset code, and an unknown field. The entries are declared in order: among equally
//! specific patterns the first wins ([`super::PricedCapability`]).
//!
//! ```
//! use stipendex::receiver::price_file;
//! let prices = price_file::from_toml(r#"
//!     [[price]]
//!     kind = "tool"
//!     pattern = "search"
//!     amount = "0.005"
//!     asset = "USDC"
//! "#)?;
//! assert_eq!(prices[0].method(), "tools/call");
//! assert_eq!(prices[0].name(), "search");
//! # Ok::<(), stipendex::Error>(())
//! ```

use std::path::Path;

use rail_core::{Amount, Asset, Money};
use serde::Deserialize;

use super::pricing::{Price, PricedCapability};
use crate::Error;

/// What a `[[price]]` entry prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An MCP tool (`tools/call`), by name.
    Tool,
    /// An MCP resource (`resources/read`), by URI.
    Resource,
    /// An MCP prompt (`prompts/get`), by name.
    Prompt,
    /// An HTTP route: a method and a path.
    Route,
}

impl Kind {
    /// The method an MCP kind prices (`None` for a route, which names its own).
    #[must_use]
    pub const fn mcp_method(self) -> Option<&'static str> {
        match self {
            Kind::Tool => Some("tools/call"),
            Kind::Resource => Some("resources/read"),
            Kind::Prompt => Some("prompts/get"),
            Kind::Route => None,
        }
    }
}

/// The profile an entry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileName {
    /// A fixed amount.
    Service,
    /// An estimate and a tolerance (held, captured for the final amount).
    Checkout,
}

/// One `[[price]]` entry as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// What it prices.
    pub kind: Kind,
    /// The name pattern (tool name, resource URI, path).
    pub pattern: String,
    /// The HTTP method (routes only).
    pub method: Option<String>,
    /// The asset code (`USD`, `USDC`, `ALGO`, `BTC`).
    pub asset: String,
    /// The fixed amount (service).
    pub amount: Option<String>,
    /// The estimate (checkout).
    pub estimate: Option<String>,
    /// How far above the estimate the final amount may go (checkout).
    pub tolerance: Option<String>,
    /// The profile (defaults from the amounts given).
    pub profile: Option<ProfileName>,
    /// What it is, for the Quote's description.
    pub description: Option<String>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    price: Vec<toml::Spanned<toml::Value>>,
}

/// The `[[price]]` entries of the TOML document `text` (other tables are ignored), in order.
///
/// # Errors
/// [`Error::Config`] naming the entry by its position and line (`[[price]] entry 2 (line 7):
/// unknown asset "EUR": …`), or the line and column of a document that is not TOML.
pub fn from_toml(text: &str) -> Result<Vec<PricedCapability>, Error> {
    entries(None, text)
}

/// As [`from_toml`], for the text of the file at `path`, which every message names
/// (`shop.toml line 3, column 10: …`, `shop.toml: [[price]] entry 2 (line 7): …`).
///
/// # Errors
/// As [`from_toml`].
pub fn from_toml_at(path: &Path, text: &str) -> Result<Vec<PricedCapability>, Error> {
    entries(Some(&path.display().to_string()), text)
}

fn entries(file: Option<&str>, text: &str) -> Result<Vec<PricedCapability>, Error> {
    let doc: File = toml::from_str(text)
        .map_err(|e| Error::Config(crate::registry::toml_error_in(file, text, &e)))?;
    doc.price
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let (line, _) = crate::registry::line_column(text, v.span().start);
            let at = match file {
                Some(f) => format!("{f}: [[price]] entry {} (line {line})", i + 1),
                None => format!("[[price]] entry {} (line {line})", i + 1),
            };
            let e: Entry = v.into_inner().try_into().map_err(|e: toml::de::Error| {
                Error::Config(format!("{at}: {}", crate::registry::one_line(e.message())))
            })?;
            capability(&e).map_err(|why| Error::Config(format!("{at}: {why}")))
        })
        .collect()
}

/// The priced capability of one entry.
///
/// # Errors
/// Why the entry is not a price, as a sentence.
pub fn capability(e: &Entry) -> Result<PricedCapability, String> {
    let method = match (e.kind.mcp_method(), &e.method) {
        (Some(m), None) => m.to_owned(),
        (Some(_), Some(m)) => {
            return Err(format!(
                "`method = \"{m}\"` is for routes only: a {:?} entry prices {}",
                e.kind,
                e.kind.mcp_method().unwrap_or_default()
            ));
        }
        (None, Some(m)) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => m.clone(),
        (None, Some(m)) => {
            return Err(format!(
                "`method = \"{m}\"` is not an HTTP method in upper case (GET, POST, …)"
            ));
        }
        (None, None) => return Err("a route names its `method` (GET, POST, …)".into()),
    };
    if e.pattern.is_empty() {
        return Err("the pattern is empty".into());
    }
    if e.kind == Kind::Route && !e.pattern.starts_with('/') {
        return Err("a route's pattern is a path: it starts with `/`".into());
    }
    let asset = Asset::by_code(&e.asset)
        .ok_or_else(|| format!("unknown asset {:?}: use USD, USDC, ALGO or BTC", e.asset))?;
    let money = |field: &str, v: &str| {
        Money::parse(asset.clone(), v).map_err(|err| format!("`{field} = \"{v}\"`: {err}"))
    };
    let price = match (&e.amount, &e.estimate, &e.tolerance) {
        (Some(a), None, None) => {
            if e.profile == Some(ProfileName::Checkout) {
                return Err(
                    "a checkout is priced by `estimate` and `tolerance`, not `amount`".into(),
                );
            }
            Price::Fixed(money("amount", a)?)
        }
        (None, Some(est), Some(tol)) => {
            if e.profile == Some(ProfileName::Service) {
                return Err(
                    "a service price is a fixed `amount`; `estimate` + `tolerance` is a checkout"
                        .into(),
                );
            }
            let estimate = money("estimate", est)?;
            let tolerance: Amount = money("tolerance", tol)?.amount();
            let p = Price::Estimate {
                estimate,
                tolerance,
            };
            p.max().map_err(|err| err.to_string())?;
            p
        }
        _ => {
            return Err(
                "give either `amount` (service) or both `estimate` and `tolerance` (checkout)"
                    .into(),
            );
        }
    };
    let cap = match price {
        Price::Fixed(m) => PricedCapability::fixed(method, &e.pattern, m),
        Price::Estimate {
            estimate,
            tolerance,
        } => PricedCapability::estimate(method, &e.pattern, estimate, tolerance),
    };
    Ok(match &e.description {
        Some(d) => cap.describe(d.clone()),
        None => cap,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_and_both_profiles_parse_in_order() {
        let caps = from_toml(
            r#"
            [store]
            url = "memory"

            [[price]]
            kind = "tool"
            pattern = "search_*"
            amount = "0.005"
            asset = "USDC"
            description = "one search"

            [[price]]
            kind = "tool"
            pattern = "render"
            estimate = "1.00"
            tolerance = "0.50"
            asset = "USD"

            [[price]]
            kind = "resource"
            pattern = "reports://*"
            amount = "0.02"
            asset = "USD"

            [[price]]
            kind = "prompt"
            pattern = "brief"
            amount = "0.001"
            asset = "ALGO"

            [[price]]
            kind = "route"
            method = "GET"
            pattern = "/api/posts/{id}"
            amount = "0.10"
            asset = "USD"
            "#,
        )
        .unwrap();
        let got: Vec<(&str, &str)> = caps.iter().map(|c| (c.method(), c.name())).collect();
        assert_eq!(
            got,
            [
                ("tools/call", "search_*"),
                ("tools/call", "render"),
                ("resources/read", "reports://*"),
                ("prompts/get", "brief"),
                ("GET", "/api/posts/{id}"),
            ]
        );
        assert_eq!(caps[0].description.as_deref(), Some("one search"));
        assert!(matches!(caps[1].price, Price::Estimate { .. }));
        assert_eq!(
            caps[1].price.max().unwrap(),
            Money::parse(Asset::usd(), "1.50").unwrap()
        );
    }

    #[test]
    fn a_bad_entry_is_named_and_refused() {
        let bad = |entry: &str| {
            from_toml(&format!("[[price]]\n{entry}"))
                .unwrap_err()
                .to_string()
        };
        let e = bad("kind = \"tool\"\npattern = \"x\"\namount = \"0.001\"\nasset = \"USD\"");
        assert!(
            e.starts_with("configuration: [[price]] entry 1 (line 1): ") && e.contains("amount"),
            "{e}"
        );
        let e = bad("kind = \"tool\"\npattern = \"x\"\namount = \"1\"\nasset = \"EUR\"");
        assert!(e.contains("unknown asset"), "{e}");
        let e = bad("kind = \"route\"\npattern = \"/x\"\namount = \"1\"\nasset = \"USD\"");
        assert!(e.contains("names its `method`"), "{e}");
        let e = bad(
            "kind = \"tool\"\nmethod = \"GET\"\npattern = \"x\"\namount = \"1\"\nasset = \"USD\"",
        );
        assert!(e.contains("routes only"), "{e}");
        let e = bad(
            "kind = \"tool\"\npattern = \"x\"\namount = \"1\"\nprofile = \"checkout\"\nasset = \"USD\"",
        );
        assert!(e.contains("estimate"), "{e}");
        let e = bad("kind = \"tool\"\npattern = \"x\"\nestimate = \"1\"\nasset = \"USD\"");
        assert!(e.contains("either `amount`"), "{e}");
        let e = bad("kind = \"tool\"\npattern = \"x\"\namount = \"1\"\nasset = \"USD\"\nprice = 3");
        assert!(e.contains("unknown field"), "{e}");
        let e = bad("kind = \"file\"\npattern = \"x\"\namount = \"1\"\nasset = \"USD\"");
        assert!(e.contains("entry 1 (line 1): "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = bad(
            "kind = \"route\"\nmethod = \"get\"\npattern = \"/x\"\namount = \"1\"\nasset = \"USD\"",
        );
        assert!(e.contains("upper case"), "{e}");
    }
}
