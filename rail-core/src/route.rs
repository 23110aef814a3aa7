//! The one pattern syntax for every priced thing: HTTP paths (`/api/posts/{id}`), MCP tool
//! names (`search_*`), resource URIs (`private://*`) — the x402 paywall, the Stipendex
//! receiver and, later, the MCP and ContextVM gates all match with [`RoutePattern`], and pick
//! among several matches with [`most_specific`].
//!
//! A pattern and a name are split on `/` into segments; each segment of the **name** is
//! percent-decoded before it is compared, so `/api/posts/%31` is `/api/posts/1` and no
//! spelling of a priced path escapes its price. A pattern segment is:
//! - `{name}`: exactly one non-empty segment;
//! - `{*name}` (last only): one or more segments, not all empty — the non-empty rest;
//! - ending in `*` (last only): a prefix — the rest of the name, joined by `/`, starts with
//!   the text before the `*` (`search_*`, `private://*`; `*` alone matches every name, the
//!   empty one included);
//! - anything else: literal text, compared exactly (case matters, as in axum's router).
//!
//! When several patterns match, the most specific wins: segment by segment from the left, a
//! literal beats a prefix (a longer prefix beats a shorter one), which beats `{name}`, which
//! beats `{*name}`; between equals, the first declared.
//!
//! **Matching that fails closed.** A priced path must not be reachable unpaid under a spelling
//! the service behind it serves as the same resource. Two rules do it:
//! - [`canonical_path`] refuses, before any decision, a path that could mean another path to
//!   a server: an encoded `/` or `\`, a `;` (path parameters), a control character or `%00`,
//!   an invalid escape, bytes that are not UTF-8, a `.` or `..` segment, an empty segment, or
//!   an escape that decodes to another escape (`%252F`). What it accepts has one canonical
//!   encoding ([`CanonicalPath::encoded`]), the one a gateway forwards.
//! - [`PathMatching::Lenient`] (the default) compares literal text without regard to case and
//!   prices a path as its route modulo one trailing slash, as Express, ASP.NET and many
//!   frameworks serve it; [`PathMatching::Strict`] compares exactly, for an upstream known to
//!   (axum's router is).
//!
//! ```
//! use rail_core::route::{RoutePattern, most_specific, decoded_segments};
//!
//! let p = RoutePattern::parse("/api/posts/{id}");
//! assert!(p.matches_path("/api/posts/1"));
//! assert!(p.matches_path("/api/posts/%31"));
//! assert!(!p.matches_path("/api/posts/"));
//! assert!(!p.matches_path("/api/posts/1/comments"));
//! assert!(RoutePattern::parse("private://*").matches_path("private://notes/1"));
//!
//! let patterns = [RoutePattern::parse("*"), RoutePattern::parse("search_*"), RoutePattern::parse("search_web")];
//! let pick = |name: &str| most_specific(patterns.iter().map(|p| (p, p.as_str())), &decoded_segments(name));
//! assert_eq!(pick("search_web"), Some("search_web"));
//! assert_eq!(pick("search_img"), Some("search_*"));
//! assert_eq!(pick("add"), Some("*"));
//!
//! use rail_core::route::{PathMatching, canonical_path};
//! let p = RoutePattern::parse("/api/forecast/{city}");
//! assert!(p.matches_as(&decoded_segments("/API/Forecast/paris/"), PathMatching::Lenient));
//! assert!(!p.matches_as(&decoded_segments("/API/Forecast/paris/"), PathMatching::Strict));
//! assert_eq!(canonical_path("/api/%70osts/%C3%A9").unwrap().encoded(), "/api/posts/%C3%A9");
//! assert!(canonical_path("/api%2Fforecast%2Fparis").is_err());
//! ```

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
    Prefix(String),
}

/// A parsed path pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePattern {
    pattern: String,
    segments: Vec<Segment>,
    /// `segments` with literal and prefix text lowercased, for [`PathMatching::Lenient`].
    folded: Vec<Segment>,
    /// [`RoutePattern::rank`], computed once at parse (it ranks every match of every request).
    rank: Vec<(u8, usize)>,
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes one path segment (invalid escapes are kept as they are).
#[must_use]
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex_val),
                b.get(i + 2).copied().and_then(hex_val),
            )
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request path split on `/` with each segment percent-decoded
/// (`/api/posts/%31` → `["", "api", "posts", "1"]`).
#[must_use]
pub fn decoded_segments(path: &str) -> Vec<String> {
    path.split('/').map(percent_decode).collect()
}

/// Why a request path is refused before any decision: it could name another path to the
/// server that serves it (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathRefusal {
    /// The path does not start with `/`.
    #[error("the path does not start with `/`")]
    NotAbsolute,
    /// `%` not followed by two hex digits.
    #[error("the path has an invalid escape (`%` not followed by two hex digits)")]
    BadEscape,
    /// A segment decodes to bytes that are not UTF-8.
    #[error("the path decodes to bytes that are not UTF-8")]
    NotUtf8,
    /// An encoded `/` (`%2F`): one segment here, two to a server that decodes first.
    #[error("the path has an encoded `/` (`%2F`)")]
    EncodedSlash,
    /// A `\`, raw or encoded: a separator to some servers.
    #[error("the path has a backslash")]
    Backslash,
    /// A `;`, raw or encoded: path parameters, which some servers strip.
    #[error("the path has a `;` (path parameters)")]
    Semicolon,
    /// A control character (`%00`–`%1F`, `%7F`).
    #[error("the path has a control character (such as `%00`)")]
    Control,
    /// A `.` or `..` segment, raw or encoded.
    #[error("the path has a `.` or `..` segment")]
    DotSegment,
    /// An empty segment (`//`).
    #[error("the path has an empty segment (`//`)")]
    EmptySegment,
    /// An escape whose decoding is another escape (`%252F`): a server that decodes twice sees
    /// another path.
    #[error("the path has an escape that decodes to another escape (such as `%252F`)")]
    DoubleEncoded,
}

/// A request path accepted by [`canonical_path`]: its decoded segments and its one canonical
/// encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalPath {
    segments: Vec<String>,
    encoded: String,
}

impl CanonicalPath {
    /// The decoded segments (`/a/b%20c` → `["", "a", "b c"]`), as [`decoded_segments`] gives.
    #[must_use]
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The canonical encoding: each segment percent-encoded except the characters RFC 3986
    /// allows in a segment as they are (unreserved, `!$&'()*+,=:@`), hex in upper case.
    #[must_use]
    pub fn encoded(&self) -> &str {
        &self.encoded
    }
}

/// Checks a raw request path (no query) and gives its canonical form, or why it is refused
/// (see [`PathRefusal`]): what a binding does before it decides anything about the request.
///
/// # Errors
/// [`PathRefusal`], naming the first thing wrong.
pub fn canonical_path(raw: &str) -> Result<CanonicalPath, PathRefusal> {
    if !raw.starts_with('/') {
        return Err(PathRefusal::NotAbsolute);
    }
    let parts: Vec<&str> = raw.split('/').collect();
    let last = parts.len().saturating_sub(1);
    let mut segments = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let bytes = strict_decode(part)?;
        let seg = String::from_utf8(bytes).map_err(|_| PathRefusal::NotUtf8)?;
        if seg.contains('/') {
            return Err(PathRefusal::EncodedSlash);
        }
        if seg.contains('\\') {
            return Err(PathRefusal::Backslash);
        }
        if seg.contains(';') {
            return Err(PathRefusal::Semicolon);
        }
        if seg.chars().any(|c| c.is_ascii_control()) {
            return Err(PathRefusal::Control);
        }
        if seg == "." || seg == ".." {
            return Err(PathRefusal::DotSegment);
        }
        if seg.is_empty() && i != 0 && i != last {
            return Err(PathRefusal::EmptySegment);
        }
        if strict_decode(&seg).is_ok_and(|d| d != seg.as_bytes()) {
            return Err(PathRefusal::DoubleEncoded);
        }
        segments.push(seg);
    }
    let encoded = segments
        .iter()
        .map(|s| encode_segment(s))
        .collect::<Vec<_>>()
        .join("/");
    Ok(CanonicalPath { segments, encoded })
}

/// Percent-decodes `s`, refusing an invalid escape.
fn strict_decode(s: &str) -> Result<Vec<u8>, PathRefusal> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            match (
                b.get(i + 1).copied().and_then(hex_val),
                b.get(i + 2).copied().and_then(hex_val),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                }
                _ => return Err(PathRefusal::BadEscape),
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    Ok(out)
}

/// One segment in the canonical encoding.
fn encode_segment(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,=:@".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

impl RoutePattern {
    /// Parses a pattern (see the module docs): `{name}` is one non-empty segment, `{*name}`
    /// the non-empty rest, a last segment ending in `*` a prefix of the rest.
    #[must_use]
    pub fn parse(pattern: &str) -> Self {
        let parts: Vec<&str> = pattern.split('/').collect();
        let last = parts.len().saturating_sub(1);
        let segments: Vec<Segment> = parts
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.starts_with("{*") && s.ends_with('}') {
                    Segment::Rest
                } else if s.starts_with('{') && s.ends_with('}') && s.len() > 2 {
                    Segment::Param
                } else if let Some(prefix) = s.strip_suffix('*').filter(|_| i == last) {
                    Segment::Prefix(prefix.to_owned())
                } else {
                    Segment::Literal((*s).to_owned())
                }
            })
            .collect();
        let rank = segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => (4, l.len()),
                Segment::Prefix(p) => (3, p.len()),
                Segment::Param => (2, 0),
                Segment::Rest => (1, 0),
            })
            .collect();
        let folded = segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => Segment::Literal(l.to_lowercase()),
                Segment::Prefix(p) => Segment::Prefix(p.to_lowercase()),
                other => other.clone(),
            })
            .collect();
        Self {
            pattern: pattern.to_owned(),
            segments,
            folded,
            rank,
        }
    }

    /// The pattern as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the decoded segments of a path (see [`decoded_segments`]) match, exactly
    /// ([`PathMatching::Strict`]).
    #[must_use]
    pub fn matches(&self, decoded: &[String]) -> bool {
        segments_match(&self.segments, decoded)
    }

    /// Whether the decoded segments of a path match under `mode`.
    #[must_use]
    pub fn matches_as(&self, decoded: &[String], mode: PathMatching) -> bool {
        match mode {
            PathMatching::Strict => self.matches(decoded),
            PathMatching::Lenient => Spellings::of(decoded)
                .0
                .iter()
                .any(|n| segments_match(&self.folded, n)),
        }
    }

    /// Whether a raw request path matches.
    #[must_use]
    pub fn matches_path(&self, path: &str) -> bool {
        self.matches(&decoded_segments(path))
    }

    /// How specific the pattern is: compared segment by segment from the left (literal, then
    /// prefix by length, then `{name}`, then `{*name}`); greater is more specific.
    #[must_use]
    pub fn rank(&self) -> &[(u8, usize)] {
        &self.rank
    }
}

/// How a name's literal text is compared with a pattern's (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PathMatching {
    /// Literal text (and a prefix) compared without regard to case, and a name matched with or
    /// without one trailing slash: a path an upstream with common defaults (Express, ASP.NET,
    /// Spring before 6) serves as a priced route is priced as that route. Fails closed.
    #[default]
    Lenient,
    /// Exactly as written: case matters, and `/x/` is not `/x` (axum's router, an upstream
    /// known to be strict).
    Strict,
}

/// The spellings [`PathMatching::Lenient`] compares: the name lowercased, and the same with one
/// trailing slash added or removed (the root `/` is left alone).
struct Spellings(Vec<Vec<String>>);

impl Spellings {
    fn of(decoded: &[String]) -> Self {
        let lower: Vec<String> = decoded.iter().map(|s| s.to_lowercase()).collect();
        let mut toggled = lower.clone();
        match lower.last() {
            Some(last) if last.is_empty() && lower.len() > 2 => {
                toggled.pop();
            }
            Some(last) if !last.is_empty() => toggled.push(String::new()),
            _ => return Spellings(vec![lower]),
        }
        Spellings(vec![lower, toggled])
    }
}

fn segments_match(segments: &[Segment], decoded: &[String]) -> bool {
    let mut it = decoded.iter();
    for (i, seg) in segments.iter().enumerate() {
        match seg {
            Segment::Rest => return decoded.iter().skip(i).any(|s| !s.is_empty()),
            Segment::Prefix(p) => {
                let rest: Vec<&str> = it.map(String::as_str).collect();
                return !rest.is_empty() && rest.join("/").starts_with(p.as_str());
            }
            Segment::Param => match it.next() {
                Some(s) if !s.is_empty() => {}
                _ => return false,
            },
            Segment::Literal(l) => match it.next() {
                Some(s) if s == l => {}
                _ => return false,
            },
        }
    }
    it.next().is_none()
}

/// The item of the most specific pattern matching `decoded` (see [`decoded_segments`]) exactly;
/// the first declared among equally specific ones.
pub fn most_specific<'a, T>(
    candidates: impl IntoIterator<Item = (&'a RoutePattern, T)>,
    decoded: &[String],
) -> Option<T> {
    most_specific_as(candidates, decoded, PathMatching::Strict)
}

/// [`most_specific`] under `mode`.
pub fn most_specific_as<'a, T>(
    candidates: impl IntoIterator<Item = (&'a RoutePattern, T)>,
    decoded: &[String],
    mode: PathMatching,
) -> Option<T> {
    let spellings = match mode {
        PathMatching::Strict => None,
        PathMatching::Lenient => Some(Spellings::of(decoded)),
    };
    let mut best: Option<(&[(u8, usize)], T)> = None;
    for (p, item) in candidates {
        let hit = match &spellings {
            None => p.matches(decoded),
            Some(sp) => sp.0.iter().any(|n| segments_match(&p.folded, n)),
        };
        if !hit {
            continue;
        }
        let rank = p.rank();
        if best.as_ref().is_none_or(|(r, _)| rank > *r) {
            best = Some((rank, item));
        }
    }
    best.map(|(_, item)| item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_every_spelling_of_a_path() {
        let m = |p: &str, path: &str| RoutePattern::parse(p).matches_path(path);
        let posts = "/api/posts/{id}";
        assert!(m(posts, "/api/posts/1"));
        assert!(m(posts, "/api/posts/%31"));
        assert!(m(posts, "/api/%70osts/1"));
        assert!(!m(posts, "/api/posts"));
        assert!(!m(posts, "/api/posts/"));
        assert!(!m(posts, "/api/posts/1/x"));
        assert!(m("/api/posts/1", "/api/posts/%31"));
        assert!(!m("/api/posts/1", "/api/posts/2"));
        assert!(!m("/files/{*path}", "/files"));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("a%2Fb"), "a/b");
    }

    #[test]
    fn prefixes_and_the_most_specific_match() {
        let m = |p: &str, name: &str| RoutePattern::parse(p).matches_path(name);
        assert!(m("private://*", "private://x"));
        assert!(m("private://*", "private://a/b"));
        assert!(!m("private://*", "public://x"));
        assert!(m("search*", "search_web"));
        assert!(!m("search*", "web_search"));
        assert!(m("*", "anything/at/all"));
        assert!(m("/api/*", "/api/x/y"));
        assert!(!m("/api/*", "/apix"));
        // `*` is a wildcard only at the end.
        assert!(m("/a*b", "/a*b"));
        assert!(!m("/a*b", "/axb"));
        let ps: Vec<RoutePattern> = [
            "/{*rest}",
            "/api/{*rest}",
            "/api/posts/{id}",
            "/api/posts/top",
            "/api/*",
        ]
        .iter()
        .map(|p| RoutePattern::parse(p))
        .collect();
        let pick =
            |path: &str| most_specific(ps.iter().map(|p| (p, p.as_str())), &decoded_segments(path));
        assert_eq!(pick("/api/posts/top"), Some("/api/posts/top"));
        assert_eq!(pick("/api/posts/%74op"), Some("/api/posts/top"));
        assert_eq!(pick("/api/posts/7"), Some("/api/posts/{id}"));
        assert_eq!(pick("/api/x"), Some("/api/*"));
        assert_eq!(pick("/other"), Some("/{*rest}"));
        assert_eq!(pick("/"), None);
    }

    #[test]
    fn paths_that_could_mean_another_path_are_refused() {
        use PathRefusal as R;
        let refused = |p: &str| canonical_path(p).err();
        assert_eq!(refused("/api/forecast%2Fparis"), Some(R::EncodedSlash));
        assert_eq!(refused("/api%2fforecast%2Fparis"), Some(R::EncodedSlash));
        assert_eq!(refused("/api\\forecast"), Some(R::Backslash));
        assert_eq!(refused("/api%5Cforecast"), Some(R::Backslash));
        assert_eq!(refused("/api/forecast/paris;x=1"), Some(R::Semicolon));
        assert_eq!(refused("/api;v=2/forecast/paris"), Some(R::Semicolon));
        assert_eq!(refused("/api/forecast/paris%3B"), Some(R::Semicolon));
        assert_eq!(refused("/api/forecast/paris%00"), Some(R::Control));
        assert_eq!(refused("/api/forecast/%0a"), Some(R::Control));
        assert_eq!(refused("/api/forecast/%7F"), Some(R::Control));
        assert_eq!(refused("/api/forecast/%zz"), Some(R::BadEscape));
        assert_eq!(refused("/api/forecast/%4"), Some(R::BadEscape));
        assert_eq!(refused("/api/forecast/%"), Some(R::BadEscape));
        assert_eq!(refused("/api/forecast/%FF"), Some(R::NotUtf8));
        assert_eq!(refused("/api/./forecast"), Some(R::DotSegment));
        assert_eq!(refused("/api/%2e%2E/forecast"), Some(R::DotSegment));
        assert_eq!(refused("/api//forecast"), Some(R::EmptySegment));
        assert_eq!(refused("/api/forecast/%252Fparis"), Some(R::DoubleEncoded));
        assert_eq!(refused("api/forecast"), Some(R::NotAbsolute));
        // Accepted, with one canonical encoding.
        let c = |p: &str| canonical_path(p).unwrap().encoded().to_owned();
        assert_eq!(c("/"), "/");
        assert_eq!(c("/api/forecast/paris/"), "/api/forecast/paris/");
        assert_eq!(c("/api/%70osts/1"), "/api/posts/1");
        assert_eq!(c("/a%20b/caf%c3%a9"), "/a%20b/caf%C3%A9");
        assert_eq!(c("/a:b@c!$&'()*+,=/~-._"), "/a:b@c!$&'()*+,=/~-._");
        assert_eq!(c("/100%25"), "/100%25");
        assert_eq!(c("/x%22y%3Fz%23"), "/x%22y%3Fz%23");
        // The canonical form is its own canonical form, and decodes to the same segments.
        for p in ["/api/%70osts/1", "/a%20b/caf%c3%a9", "/x%22y%3Fz%23/"] {
            let once = canonical_path(p).unwrap();
            let twice = canonical_path(once.encoded()).unwrap();
            assert_eq!(once, twice);
            assert_eq!(once.segments(), decoded_segments(p).as_slice());
        }
    }

    #[test]
    fn lenient_matching_prices_every_case_and_trailing_slash() {
        let forecast = RoutePattern::parse("/api/forecast/{city}");
        let lenient = |p: &RoutePattern, path: &str| {
            p.matches_as(&decoded_segments(path), PathMatching::Lenient)
        };
        let strict = |p: &RoutePattern, path: &str| {
            p.matches_as(&decoded_segments(path), PathMatching::Strict)
        };
        for path in [
            "/api/forecast/paris",
            "/API/forecast/paris",
            "/api/Forecast/paris",
            "/api/forecast/paris/",
            "/Api/FORECAST/Paris/",
            "/api/%46orecast/paris",
        ] {
            assert!(lenient(&forecast, path), "{path}");
        }
        assert!(strict(&forecast, "/api/forecast/paris"));
        assert!(!strict(&forecast, "/API/forecast/paris"));
        assert!(!strict(&forecast, "/api/forecast/paris/"));
        // One trailing slash, not two, and not a missing segment.
        assert!(!lenient(&forecast, "/api/forecast/"));
        assert!(!lenient(&forecast, "/api/forecast"));
        let weather = RoutePattern::parse("/weather");
        assert!(lenient(&weather, "/WEATHER/"));
        assert!(!lenient(&weather, "/weather/x"));
        let dir = RoutePattern::parse("/docs/");
        assert!(lenient(&dir, "/docs"));
        assert!(lenient(&dir, "/Docs/"));
        let root = RoutePattern::parse("/");
        assert!(lenient(&root, "/"));
        assert!(!lenient(&root, "/x"));
        let prefix = RoutePattern::parse("/api/*");
        assert!(lenient(&prefix, "/API/x"));
        assert!(lenient(&prefix, "/api/"));
        // The most specific match is taken over every spelling.
        let ps: Vec<RoutePattern> = ["/{*rest}", "/api/forecast/{city}", "/api/forecast/top"]
            .iter()
            .map(|p| RoutePattern::parse(p))
            .collect();
        let pick = |path: &str| {
            most_specific_as(
                ps.iter().map(|p| (p, p.as_str())),
                &decoded_segments(path),
                PathMatching::Lenient,
            )
        };
        assert_eq!(pick("/API/FORECAST/TOP/"), Some("/api/forecast/top"));
        assert_eq!(pick("/Api/Forecast/Paris"), Some("/api/forecast/{city}"));
        assert_eq!(pick("/other/"), Some("/{*rest}"));
    }

    #[test]
    fn rest_and_params() {
        let p = RoutePattern::parse("/files/{*path}");
        assert!(p.matches_path("/files/a/b"));
        assert!(!p.matches_path("/files/"));
        assert!(!p.matches_path("/other/a"));
        let lit = RoutePattern::parse("/weather");
        assert!(lit.matches_path("/weather"));
        assert!(lit.matches_path("/%77eather"));
        assert!(!lit.matches_path("/weather/"));
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }
}
