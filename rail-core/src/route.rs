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
        Self {
            pattern: pattern.to_owned(),
            segments,
            rank,
        }
    }

    /// The pattern as written.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the decoded segments of a path (see [`decoded_segments`]) match.
    #[must_use]
    pub fn matches(&self, decoded: &[String]) -> bool {
        let mut it = decoded.iter();
        for (i, seg) in self.segments.iter().enumerate() {
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

/// The item of the most specific pattern matching `decoded` (see [`decoded_segments`]); the
/// first declared among equally specific ones.
pub fn most_specific<'a, T>(
    candidates: impl IntoIterator<Item = (&'a RoutePattern, T)>,
    decoded: &[String],
) -> Option<T> {
    let mut best: Option<(&[(u8, usize)], T)> = None;
    for (p, item) in candidates {
        if !p.matches(decoded) {
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
