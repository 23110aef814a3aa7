//! The start-up checks every serving command runs (`stipendex gateway`, `stipendex
//! serve-mcp`): a price no configured rail can be paid in is refused; a priced tool the
//! upstream does not list, and a listen address clients are not told about, are warned.
//!
//! The checks are pure functions of the configuration (and of what the upstream lists): the
//! commands print the refusal or the warning, each one sentence.

use std::net::SocketAddr;
use std::path::Path;

use stipendex::Registry;
use stipendex::receiver::{Price, PricedCapability};

use crate::{CliError, msg};

/// The assets the registry's rails receive (the receiving side configured).
pub(crate) fn receiving_assets(registry: &Registry) -> Vec<rail_core::Asset> {
    registry
        .rails()
        .filter(|e| e.receiver.is_some())
        .filter_map(stipendex::Entry::capabilities)
        .flat_map(|c| c.assets)
        .collect()
}

/// The asset a price is asked in.
fn asset_of(cap: &PricedCapability) -> &rail_core::Asset {
    match &cap.price {
        Price::Fixed(m) => m.asset(),
        Price::Estimate { estimate, .. } => estimate.asset(),
    }
}

/// Refuses prices that could never be paid: a configuration (`path`) with no rail that
/// receives, or a `[[price]]` entry in an asset none of `assets` is.
///
/// # Errors
/// One sentence naming the file or the entry, and what to change.
pub(crate) fn prices_payable(
    path: &Path,
    assets: &[rail_core::Asset],
    prices: &[PricedCapability],
) -> Result<(), CliError> {
    if assets.is_empty() {
        return Err(msg(format!(
            "{} has no rail that receives: configure the receiving side of a [rails.NAME] (pay_to, payee_account, …)",
            path.display()
        )));
    }
    for (i, cap) in prices.iter().enumerate() {
        let asset = asset_of(cap);
        if !assets.contains(asset) {
            return Err(msg(format!(
                "[[price]] entry {} ({}): no configured rail receives {}: price it in {} or configure a rail that carries it",
                i + 1,
                cap.name(),
                asset.code(),
                assets
                    .iter()
                    .map(rail_core::Asset::code)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

/// The priced tool patterns (`[[price]] kind = "tool"`) that match none of the tools the
/// upstream lists (`listed`): such a price is never asked, and a typo in it leaves the real
/// tool free.
pub(crate) fn unlisted_tools<'a>(
    prices: &'a [PricedCapability],
    listed: &[String],
) -> Vec<&'a str> {
    prices
        .iter()
        .filter(|c| c.method() == "tools/call")
        .filter(|c| !listed.iter().any(|t| c.pattern().matches_path(t)))
        .map(PricedCapability::name)
        .collect()
}

/// The warning for [`unlisted_tools`], if any tool is priced and not listed.
pub(crate) fn unlisted_warning(prices: &[PricedCapability], listed: &[String]) -> Option<String> {
    let unlisted = unlisted_tools(prices, listed);
    if unlisted.is_empty() {
        return None;
    }
    let names = unlisted
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "[[price]] prices the tool{} {names}, which the upstream does not list ({}): nobody can call {}, and a misspelt name leaves the real tool free; fix the pattern or remove the entry",
        if unlisted.len() == 1 { "" } else { "s" },
        if listed.is_empty() {
            "it lists no tools".to_owned()
        } else {
            listed.join(", ")
        },
        if unlisted.len() == 1 { "it" } else { "them" },
    ))
}

/// Whether the origin `origin` names the address `listen` (scheme `http`, as the gateway
/// serves; the same port; the same IP, or any host when listening on every interface, or
/// `localhost` for a loopback address).
fn names(origin: &str, listen: SocketAddr) -> bool {
    let Ok(u) = url::Url::parse(origin) else {
        return false;
    };
    if u.scheme() != "http" || u.port_or_known_default() != Some(listen.port()) {
        return false;
    }
    let ip = listen.ip();
    match u.host() {
        _ if ip.is_unspecified() => true,
        Some(url::Host::Ipv4(a)) => std::net::IpAddr::V4(a) == ip,
        Some(url::Host::Ipv6(a)) => std::net::IpAddr::V6(a) == ip,
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost") && ip.is_loopback(),
        None => false,
    }
}

/// The warning for a server listening at `listen` that none of its `origins` names: a wallet
/// reaching it there finds Quotes bound to another origin and refuses them. `None` when an
/// origin names it.
pub(crate) fn listen_warning(listen: SocketAddr, origins: &[String]) -> Option<String> {
    if origins.iter().any(|o| names(o, listen)) {
        return None;
    }
    Some(format!(
        "listening on http://{listen}, which is not among [receiver] origins ({}): wallets will refuse its quotes; add it to origins",
        origins.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stipendex::{Asset, Money};

    fn tool(name: &str, asset: Asset) -> PricedCapability {
        PricedCapability::fixed("tools/call", name, Money::parse(asset, "0.05").unwrap())
    }

    #[test]
    fn a_listen_address_an_origin_names_is_not_warned() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        let origins = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(
            listen_warning(at("127.0.0.1:8402"), &origins(&["http://127.0.0.1:8402"])).is_none()
        );
        assert!(listen_warning(at("127.0.0.1:80"), &origins(&["http://127.0.0.1"])).is_none());
        assert!(
            listen_warning(at("127.0.0.1:8402"), &origins(&["http://localhost:8402"])).is_none()
        );
        assert!(
            listen_warning(at("0.0.0.0:8402"), &origins(&["http://api.internal:8402"])).is_none()
        );
        assert!(listen_warning(at("[::1]:8402"), &origins(&["http://[::1]:8402"])).is_none());

        let w = listen_warning(
            at("127.0.0.1:8403"),
            &origins(&["http://127.0.0.1:8402", "https://api.example"]),
        )
        .unwrap();
        assert_eq!(
            w,
            "listening on http://127.0.0.1:8403, which is not among [receiver] origins (http://127.0.0.1:8402, https://api.example): wallets will refuse its quotes; add it to origins"
        );
        // Another host, another scheme (the gateway serves plain HTTP), nonsense.
        assert!(
            listen_warning(at("127.0.0.1:8402"), &origins(&["http://10.0.0.1:8402"])).is_some()
        );
        assert!(listen_warning(at("127.0.0.1:443"), &origins(&["https://127.0.0.1"])).is_some());
        assert!(listen_warning(at("127.0.0.1:8402"), &origins(&["not an origin"])).is_some());
        assert!(
            listen_warning(at("10.0.0.2:8402"), &origins(&["http://localhost:8402"])).is_some()
        );
    }

    #[test]
    fn priced_tools_the_upstream_does_not_list_are_named() {
        let prices = vec![
            tool("search", Asset::usd()),
            tool("serach", Asset::usd()),
            tool("render_*", Asset::usd()),
            PricedCapability::fixed(
                "resources/read",
                "reports://*",
                Money::parse(Asset::usd(), "0.10").unwrap(),
            ),
        ];
        let listed = vec![
            "echo".to_owned(),
            "search".to_owned(),
            "render_pdf".to_owned(),
        ];
        assert_eq!(unlisted_tools(&prices, &listed), ["serach"]);
        let w = unlisted_warning(&prices, &listed).unwrap();
        assert!(w.starts_with("[[price]] prices the tool \"serach\", which the upstream does not list (echo, search, render_pdf)"), "{w}");
        assert!(!w.contains('\n'));
        assert!(unlisted_warning(&prices[..1], &listed).is_none());
        assert!(
            unlisted_warning(&prices, &[])
                .unwrap()
                .contains("it lists no tools")
        );
    }

    #[test]
    fn a_price_no_rail_receives_is_refused_naming_the_entry() {
        let path = Path::new("shop.toml");
        let prices = vec![tool("search", Asset::usd()), tool("render", Asset::usdc())];
        assert!(prices_payable(path, &[Asset::usd(), Asset::usdc()], &prices).is_ok());
        let e = prices_payable(path, &[Asset::usd()], &prices)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "[[price]] entry 2 (render): no configured rail receives USDC: price it in USD or configure a rail that carries it"
        );
        let e = prices_payable(path, &[], &prices).unwrap_err().to_string();
        assert!(e.starts_with("shop.toml has no rail that receives"), "{e}");
    }
}
