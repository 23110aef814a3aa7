//! A rail's own discovery documents, as a hook of the rail: a binding that fronts a service (the
//! gateway) serves what each configured rail publishes beside its priced routes, and names no
//! rail. Today one rail publishes any: exact-algo's `/llms.txt` and
//! `/.well-known/exact-algo.json` (`docs/exact-algo.md` §7).

use rail_core::Money;
use x402_transport::paywall::Paywall;

/// The service in front of the rail, as its discovery documents describe it.
#[derive(Clone, Debug, Default)]
pub struct Service {
    /// Its name (the receiver's id).
    pub name: String,
    /// One paragraph: what it sells and how.
    pub summary: String,
    /// Where the human documentation is, if anywhere.
    pub docs_url: Option<String>,
    /// The MCP endpoint path (`/mcp`), if the service has one.
    pub mcp_endpoint: Option<String>,
    /// Its priced MCP tools (fixed prices only).
    pub tools: Vec<Tool>,
}

/// One priced MCP tool.
#[derive(Clone, Debug)]
pub struct Tool {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its fixed price.
    pub price: Money,
}

/// A rail's discovery documents: the routes it serves for `service`, whose HTTP routes an x402
/// paywall (`http`) prices, if any. Routes of its own only (well-known paths); the binding
/// merges them beside its own.
pub trait Discovery: Send + Sync + std::fmt::Debug {
    /// The rail's discovery routes for `service`.
    fn router(&self, service: &Service, http: Option<&Paywall>) -> axum::Router;
}

#[cfg(feature = "exact-algo")]
mod exact_algo {
    use super::{Discovery, Paywall, Service};
    use rail_exact_algo::http::{ServiceInfo, discovery_router, prices};
    use rail_exact_algo::receiver::Price;

    /// exact-algo's `/llms.txt` and `/.well-known/exact-algo.json`: its HTTP routes' and
    /// tools' prices in µALGO (a tool priced in another asset is left out).
    #[derive(Debug)]
    pub(crate) struct ExactAlgoDiscovery(pub(crate) rail_exact_algo::ExactAlgoReceiver);

    impl Discovery for ExactAlgoDiscovery {
        fn router(&self, service: &Service, http: Option<&Paywall>) -> axum::Router {
            let routes = http.map(prices).unwrap_or_default();
            let tools: Vec<Price> = service
                .tools
                .iter()
                .filter(|t| t.price.asset() == &rail_core::Asset::algo())
                .filter_map(|t| {
                    Some(Price {
                        resource: t.name.clone(),
                        description: t.description.clone(),
                        amount: u64::try_from(t.price.minor_units()).ok()?,
                    })
                })
                .collect();
            let info = ServiceInfo {
                name: service.name.clone(),
                summary: service.summary.clone(),
                docs_url: service.docs_url.clone(),
                mcp_endpoint: service.mcp_endpoint.clone(),
            };
            discovery_router(&info, &self.0, &routes, &tools)
        }
    }
}
#[cfg(feature = "exact-algo")]
pub(crate) use exact_algo::ExactAlgoDiscovery;
