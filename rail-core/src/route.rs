//! Path patterns for paywalls: which request paths a priced route covers.
//!
//! Patterns are axum-style (`/api/posts/{id}`, `/files/{*path}`). A request path is matched
//! segment by segment **after** percent-decoding each segment, so `/api/posts/%31` is the
//! same resource as `/api/posts/1` and no spelling of a priced path escapes its price.
//!
//! ```
//! use rail_core::route::RoutePattern;
//!
//! let p = RoutePattern::parse("/api/posts/{id}");
//! assert!(p.matches_path("/api/posts/1"));
//! assert!(p.matches_path("/api/posts/%31"));
//! assert!(!p.matches_path("/api/posts/"));
//! assert!(!p.matches_path("/api/posts/1/comments"));
//! ```

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

/// A parsed path pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutePattern {
    pattern: String,
    segments: Vec<Segment>,
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
    /// Parses an axum-style pattern: `{name}` is one non-empty segment, `{*name}` the
    /// non-empty rest.
    #[must_use]
    pub fn parse(pattern: &str) -> Self {
        let segments = pattern
            .split('/')
            .map(|s| {
                if s.starts_with("{*") && s.ends_with('}') {
                    Segment::Rest
                } else if s.starts_with('{') && s.ends_with('}') && s.len() > 2 {
                    Segment::Param
                } else {
                    Segment::Literal(s.to_owned())
                }
            })
            .collect();
        Self {
            pattern: pattern.to_owned(),
            segments,
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
