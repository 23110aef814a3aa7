//! Origins: where a request goes, as one parser reads it.
//!
//! Every URL is parsed once, by the `url` crate — the WHATWG parser reqwest connects with — so
//! the origin a wallet allowlists is the origin its request reaches (a hand-made split reads
//! `http://evil.example\@api.allowed.com/x` as `api.allowed.com`; WHATWG ends the authority at
//! `\`, and the request goes to `evil.example`).
//!
//! ```
//! use stipendex::origin;
//! assert_eq!(origin::of_url("HTTPS://API.Example.com:443/x?q=1")?, "https://api.example.com");
//! assert_eq!(origin::of_url("http://evil.example\\@api.allowed.com/x")?, "http://evil.example");
//! assert_eq!(origin::parse("https://shop.example:8443")?, "https://shop.example:8443");
//! assert!(origin::parse("https://shop.example/api").is_err());
//! // A ContextVM server (MCP over Nostr) is reached by its key, not a host.
//! let key = "c7ce5327646330ffe0a519c774054cbf3b4637e17e0aa5c53cbd04f92bf06a5c";
//! assert_eq!(origin::parse(&format!("nostr:{}", key.to_uppercase()))?, format!("nostr:{key}"));
//! assert!(origin::parse("nostr:c7ce").is_err());
//! # Ok::<(), stipendex::Error>(())
//! ```

use crate::Error;

/// The origin of the absolute http(s) URL `url`: `scheme://host[:port]`, lower case, the
/// default port dropped.
///
/// # Errors
/// [`Error::Malformed`] if `url` is not an absolute http(s) URL with a host.
pub fn of_url(url: &str) -> Result<String, Error> {
    parsed(url).map(|u| u.origin().ascii_serialization())
}

/// `url` parsed: an absolute http(s) URL with a host.
///
/// # Errors
/// [`Error::Malformed`] otherwise.
pub fn parsed(url: &str) -> Result<url::Url, Error> {
    let bad = || Error::Malformed(format!("{url:?} is not an http(s) URL"));
    let parsed = url::Url::parse(url).map_err(|_| bad())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(bad());
    }
    Ok(parsed)
}

/// An origin as configured (a receiver's public origin, a mandate's pinned one), normalised:
/// `scheme://host[:port]` with nothing after it (a trailing `/` is allowed), or a ContextVM
/// server's identity `nostr:<public key>` (64 hex characters, lower-cased).
///
/// # Errors
/// [`Error::Malformed`] for a URL with a path, query, fragment or user, or not http(s).
pub fn parse(origin: &str) -> Result<String, Error> {
    if let Some(key) = origin
        .get(..NOSTR.len())
        .filter(|p| p.eq_ignore_ascii_case(NOSTR))
        .and_then(|_| origin.get(NOSTR.len()..))
    {
        return nostr(key).ok_or_else(|| {
            Error::Malformed(format!(
                "{origin:?} is not a Nostr identity: write nostr:<the server's public key, 64 hex characters>"
            ))
        });
    }
    let u = parsed(origin)?;
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() || !u.username().is_empty()
    {
        return Err(Error::Malformed(format!(
            "{origin:?} is not an origin: write scheme://host[:port], with no path"
        )));
    }
    Ok(u.origin().ascii_serialization())
}

/// The scheme of a ContextVM server's identity: `nostr:<public key, 64 hex>`.
pub const NOSTR: &str = "nostr:";

/// `nostr:<key>` for a 64-hex-character key, lower case; `None` for anything else.
#[must_use]
pub fn nostr(key: &str) -> Option<String> {
    (key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("{NOSTR}{}", key.to_ascii_lowercase()))
}

/// Whether `host` (a `Host` header: `host[:port]`) names `origin` (as [`parse`] gives it); a
/// `nostr:` identity is named by no host.
#[must_use]
pub fn host_matches(origin: &str, host: &str) -> bool {
    let Ok(u) = url::Url::parse(origin) else {
        return false;
    };
    let Ok(h) = url::Url::parse(&format!("{}://{host}/", u.scheme())) else {
        return false;
    };
    h.path() == "/" && h.origin() == u.origin()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_match_their_origin_only() {
        assert!(host_matches("https://shop.example", "shop.example"));
        assert!(host_matches("https://shop.example", "SHOP.example:443"));
        assert!(host_matches("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(!host_matches("http://127.0.0.1:8080", "127.0.0.1"));
        assert!(!host_matches("https://shop.example", "evil.example"));
        assert!(!host_matches("https://shop.example", "shop.example/x"));
        assert!(!host_matches(
            "https://shop.example",
            "evil.example\\@shop.example"
        ));
    }

    #[test]
    fn configured_origins_have_no_path() {
        assert_eq!(
            parse("https://Shop.Example/").unwrap(),
            "https://shop.example"
        );
        assert!(parse("https://shop.example/api").is_err());
        assert!(parse("https://u@shop.example").is_err());
        assert!(parse("ftp://shop.example").is_err());
        assert!(parse("shop.example").is_err());
    }
}
