//! Credentials for a facilitator that requires them: the `Authorization` header of each call.
//!
//! - [`Bearer`]: a fixed token (`Authorization: Bearer <token>`).
//! - [`CdpAuth`]: a Coinbase Developer Platform API key, as Coinbase's hosted x402 facilitator
//!   (`https://api.cdp.coinbase.com/platform/v2/x402`) requires: a fresh JWT for every request,
//!   signed with the key's secret and valid for that one request for 120 seconds.
//!
//! The CDP token is the one Coinbase's SDKs make — `generateJwt` in `coinbase/cdp-sdk`
//! (`typescript/src/auth/utils/jwt.ts`; the Python twin is `python/cdp/auth/utils/jwt.py`),
//! which `@coinbase/x402` (`coinbase/x402`, `typescript/packages/coinbase-x402/src/index.ts`)
//! calls for the facilitator's `verify` and `settle`:
//!
//! - header `{"alg": "EdDSA" | "ES256", "kid": <key id>, "typ": "JWT", "nonce": <32 hex digits>}`
//!   (`EdDSA` for an Ed25519 secret: base64 of 64 bytes, the 32-byte seed then the 32-byte public
//!   key; `ES256` for an EC P-256 secret in PEM, SEC1 `EC PRIVATE KEY` or PKCS#8 `PRIVATE KEY`);
//! - claims `{"sub": <key id>, "iss": "cdp", "aud": ["cdp_service"], "nbf": now, "iat": now,
//!   "exp": now + 120, "uris": ["<METHOD> <host><path>"]}` — the method, then the host (with a
//!   port only when the URL names one) and the path, without scheme or query
//!   (`"POST api.cdp.coinbase.com/platform/v2/x402/verify"`);
//! - an ES256 signature is `r || s` (64 bytes), as JWS has it.
//!
//! A secret given with literal `\n` sequences (a PEM pasted into one line of an environment
//! file) is read as if they were newlines, as the Python SDK does. Secrets and tokens are never
//! logged, and neither type's `Debug` shows them.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use p256::ecdsa::signature::Signer as _;
use p256::pkcs8::DecodePrivateKey as _;
use serde_json::json;
use zeroize::Zeroizing;

/// The environment variable Coinbase's SDKs read the API key's id from.
pub const CDP_API_KEY_ID_ENV: &str = "CDP_API_KEY_ID";
/// The environment variable Coinbase's SDKs read the API key's secret from.
pub const CDP_API_KEY_SECRET_ENV: &str = "CDP_API_KEY_SECRET";
/// How long one CDP token is valid (the SDKs' default), in seconds.
pub const CDP_TOKEN_LIFETIME_SECS: u64 = 120;
/// The `aud` claim of a CDP token (the TypeScript SDK's default audience).
pub const CDP_AUDIENCE: &str = "cdp_service";

/// Credentials could not be read or a token could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The secret is of no form CDP issues.
    #[error("{var} is neither a base64 Ed25519 key nor a PEM EC P-256 key")]
    BadSecret {
        /// The variable (or setting) the secret came from.
        var: String,
    },
    /// A 64-byte Ed25519 secret whose second half is not the public key of its first.
    #[error(
        "{var} is a 64-byte Ed25519 key whose public half does not match its seed: copy the secret again from the CDP portal"
    )]
    MismatchedKey {
        /// The variable (or setting) the secret came from.
        var: String,
    },
    /// A credential is empty, or not set at all.
    #[error("{var} is empty or not set: give it the facilitator credential it names")]
    Missing {
        /// The variable (or setting) that should hold it.
        var: String,
    },
    /// A bearer token that cannot be sent in a header (a line break, a control character).
    #[error("{var} holds characters a header cannot carry: give the token alone, on one line")]
    BadToken {
        /// The variable (or setting) the token came from.
        var: String,
    },
    /// A request URL a token cannot name.
    #[error("cannot make a facilitator token for {url:?}: {why}")]
    BadUrl {
        /// The URL (without its query).
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

/// What a facilitator that requires authentication is sent: the `Authorization` header value
/// of one request.
///
/// Implementations must be cheap to call (once per request) and must never log what they
/// return. `authorization` answers:
/// - `Ok(value)`: send `Authorization: <value>` with this request, and only with it (a value
///   may be bound to the request's method and URL, as a CDP token is);
/// - `Err(AuthError)`: no credential can be made for this request; it is not sent, and no retry
///   helps until the configuration is fixed.
pub trait FacilitatorAuth: Send + Sync + fmt::Debug {
    /// The `Authorization` header value for `method` (`GET`, `POST`) on `url` (the full URL).
    ///
    /// # Errors
    /// [`AuthError`] if no credential can be made for this request.
    fn authorization(&self, method: &str, url: &str) -> Result<String, AuthError>;

    /// What to check when the facilitator refuses these credentials (401 or 403), as the end
    /// of a sentence: `check the API key named by cdp_key_id_env/cdp_key_secret_env`.
    fn hint(&self) -> &str;
}

/// A fixed bearer token: `Authorization: Bearer <token>` on every request.
#[derive(Clone)]
pub struct Bearer {
    value: Zeroizing<String>,
    hint: String,
}

impl fmt::Debug for Bearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bearer").finish_non_exhaustive()
    }
}

impl Bearer {
    /// The token `token` (surrounding white space trimmed). `var` names where it came from, for
    /// messages (`FACILITATOR_TOKEN`).
    ///
    /// # Errors
    /// [`AuthError::Missing`] for an empty token; [`AuthError::BadToken`] for one with a line
    /// break or another control character.
    pub fn new(token: &str, var: &str) -> Result<Self, AuthError> {
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing {
                var: var.to_owned(),
            });
        }
        if token.chars().any(char::is_control) {
            return Err(AuthError::BadToken {
                var: var.to_owned(),
            });
        }
        Ok(Bearer {
            value: Zeroizing::new(format!("Bearer {token}")),
            hint: format!("check the token in {var}"),
        })
    }

    /// What [`FacilitatorAuth::hint`] says (by default `check the token in <var>`).
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }
}

impl FacilitatorAuth for Bearer {
    fn authorization(&self, _method: &str, _url: &str) -> Result<String, AuthError> {
        Ok(self.value.as_str().to_owned())
    }

    fn hint(&self) -> &str {
        &self.hint
    }
}

/// A CDP API key's signing half.
enum CdpKey {
    Ed25519(ed25519_dalek::SigningKey),
    P256(p256::ecdsa::SigningKey),
}

impl CdpKey {
    const fn alg(&self) -> &'static str {
        match self {
            CdpKey::Ed25519(_) => "EdDSA",
            CdpKey::P256(_) => "ES256",
        }
    }

    fn sign(&self, input: &[u8]) -> Vec<u8> {
        match self {
            CdpKey::Ed25519(k) => k.sign(input).to_bytes().to_vec(),
            CdpKey::P256(k) => {
                let sig: p256::ecdsa::Signature = k.sign(input);
                sig.to_bytes().to_vec()
            }
        }
    }
}

/// A Coinbase Developer Platform API key: a fresh JWT for every request (see the
/// [module](self) for its exact form).
pub struct CdpAuth {
    key_id: String,
    key: CdpKey,
    hint: String,
}

impl fmt::Debug for CdpAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdpAuth")
            .field("key_id", &self.key_id)
            .field("alg", &self.key.alg())
            .finish_non_exhaustive()
    }
}

impl CdpAuth {
    /// The key `key_id` with secret `secret`, read from [`CDP_API_KEY_ID_ENV`] and
    /// [`CDP_API_KEY_SECRET_ENV`] as messages name them.
    ///
    /// # Errors
    /// As [`CdpAuth::named`].
    pub fn new(key_id: &str, secret: &str) -> Result<Self, AuthError> {
        Self::named(key_id, secret, CDP_API_KEY_ID_ENV, CDP_API_KEY_SECRET_ENV)
    }

    /// The key in the environment variables `CDP_API_KEY_ID` and `CDP_API_KEY_SECRET`.
    ///
    /// # Errors
    /// [`AuthError::Missing`] if either is unset or empty, else as [`CdpAuth::named`].
    pub fn from_env() -> Result<Self, AuthError> {
        let read = |var: &str| {
            std::env::var(var).map_err(|_| AuthError::Missing {
                var: var.to_owned(),
            })
        };
        let id = read(CDP_API_KEY_ID_ENV)?;
        let secret = Zeroizing::new(read(CDP_API_KEY_SECRET_ENV)?);
        Self::new(&id, &secret)
    }

    /// The key `key_id` with secret `secret`, their variables named `id_var` and `secret_var`
    /// in messages. The secret's form chooses the algorithm: a PEM EC P-256 key (SEC1 or
    /// PKCS#8; literal `\n` sequences read as newlines) signs ES256, base64 of 64 bytes (seed,
    /// then public key) signs EdDSA.
    ///
    /// # Errors
    /// [`AuthError::Missing`] for an empty key id or secret; [`AuthError::BadSecret`] for a
    /// secret of neither form; [`AuthError::MismatchedKey`] for an Ed25519 secret whose halves
    /// do not belong together.
    pub fn named(
        key_id: &str,
        secret: &str,
        id_var: &str,
        secret_var: &str,
    ) -> Result<Self, AuthError> {
        let key_id = key_id.trim();
        if key_id.is_empty() {
            return Err(AuthError::Missing {
                var: id_var.to_owned(),
            });
        }
        if secret.trim().is_empty() {
            return Err(AuthError::Missing {
                var: secret_var.to_owned(),
            });
        }
        Ok(CdpAuth {
            key_id: key_id.to_owned(),
            key: parse_secret(secret, secret_var)?,
            hint: format!("check the API key in {id_var}/{secret_var}"),
        })
    }

    /// What [`FacilitatorAuth::hint`] says (by default `check the API key in
    /// CDP_API_KEY_ID/CDP_API_KEY_SECRET`).
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }

    /// The key's id (`kid` and `sub` of every token).
    #[must_use]
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// `EdDSA` or `ES256`: the algorithm the secret signs with.
    #[must_use]
    pub fn algorithm(&self) -> &'static str {
        self.key.alg()
    }

    /// The token for `method` on `url`, issued at `now` (Unix seconds).
    fn token_at(&self, method: &str, url: &str, now: u64) -> Result<String, AuthError> {
        let header = json!({
            "alg": self.key.alg(),
            "kid": self.key_id,
            "typ": "JWT",
            "nonce": hex::encode(rand::random::<[u8; 16]>()),
        });
        let claims = json!({
            "sub": self.key_id,
            "iss": "cdp",
            "aud": [CDP_AUDIENCE],
            "nbf": now,
            "iat": now,
            "exp": now.saturating_add(CDP_TOKEN_LIFETIME_SECS),
            "uris": [request_uri(method, url)?],
        });
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = URL_SAFE_NO_PAD.encode(self.key.sign(input.as_bytes()));
        Ok(format!("{input}.{signature}"))
    }
}

impl FacilitatorAuth for CdpAuth {
    fn authorization(&self, method: &str, url: &str) -> Result<String, AuthError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(format!("Bearer {}", self.token_at(method, url, now)?))
    }

    fn hint(&self) -> &str {
        &self.hint
    }
}

/// `"<METHOD> <host>[:<port>]<path>"`: what a CDP token's `uris` names (the Python SDK's
/// `f"{method} {urlparse(url).netloc}{urlparse(url).path}"`, without credentials).
fn request_uri(method: &str, url: &str) -> Result<String, AuthError> {
    let bad = |why: &str| AuthError::BadUrl {
        url: url.split(['?', '#']).next().unwrap_or_default().to_owned(),
        why: why.to_owned(),
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    let host = parsed.host_str().ok_or_else(|| bad("it names no host"))?;
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    Ok(format!(
        "{} {host}{port}{}",
        method.to_ascii_uppercase(),
        parsed.path()
    ))
}

/// The secret as CDP issues it, after undoing what environment files do to it.
fn parse_secret(secret: &str, var: &str) -> Result<CdpKey, AuthError> {
    let mut text = Zeroizing::new(secret.trim().to_owned());
    // A value quoted in an environment file that kept its quotes.
    if text.len() >= 2 && text.starts_with('"') && text.ends_with('"') {
        *text = text
            .get(1..text.len() - 1)
            .unwrap_or_default()
            .trim()
            .to_owned();
    }
    if text.contains("\\n") {
        *text = text.replace("\\n", "\n");
    }
    if text.contains('\r') {
        *text = text.replace("\r\n", "\n");
    }
    let bad = || AuthError::BadSecret {
        var: var.to_owned(),
    };
    if text.contains("-----BEGIN") {
        let pem = text.trim();
        let secret = if pem.contains("-----BEGIN EC PRIVATE KEY-----") {
            p256::SecretKey::from_sec1_pem(pem).map_err(|_| bad())?
        } else {
            p256::SecretKey::from_pkcs8_pem(pem).map_err(|_| bad())?
        };
        return Ok(CdpKey::P256(p256::ecdsa::SigningKey::from(secret)));
    }
    let bytes = Zeroizing::new(STANDARD.decode(text.as_bytes()).map_err(|_| bad())?);
    let (Some(seed), Some(public)) = (bytes.get(..32), bytes.get(32..)) else {
        return Err(bad());
    };
    if public.len() != 32 {
        return Err(bad());
    }
    let mut seed32 = Zeroizing::new([0u8; 32]);
    seed32.copy_from_slice(seed);
    let key = ed25519_dalek::SigningKey::from_bytes(&seed32);
    if key.verifying_key().as_bytes().as_slice() != public {
        return Err(AuthError::MismatchedKey {
            var: var.to_owned(),
        });
    }
    Ok(CdpKey::Ed25519(key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;
    use ed25519_dalek::Verifier as _;
    use p256::pkcs8::EncodePrivateKey as _;
    use serde_json::Value;

    const URL: &str = "https://api.cdp.coinbase.com/platform/v2/x402/verify";
    const KEY_ID: &str = "organizations/org-1/apiKeys/key-1";

    fn ed25519_secret() -> (String, ed25519_dalek::VerifyingKey) {
        let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        let mut both = key.to_bytes().to_vec();
        both.extend_from_slice(key.verifying_key().as_bytes());
        (STANDARD.encode(both), key.verifying_key())
    }

    fn p256_key() -> p256::SecretKey {
        loop {
            if let Ok(k) = p256::SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
                return k;
            }
        }
    }

    /// (header, claims, signing input, signature) of a compact JWS.
    fn parts(token: &str) -> (Value, Value, String, Vec<u8>) {
        let token = token.strip_prefix("Bearer ").unwrap();
        let segs: Vec<&str> = token.split('.').collect();
        assert_eq!(segs.len(), 3, "{token}");
        let json = |s: &str| serde_json::from_slice(&URL_SAFE_NO_PAD.decode(s).unwrap()).unwrap();
        (
            json(segs[0]),
            json(segs[1]),
            format!("{}.{}", segs[0], segs[1]),
            URL_SAFE_NO_PAD.decode(segs[2]).unwrap(),
        )
    }

    fn check_claims(header: &Value, claims: &Value, alg: &str, uri: &str) {
        assert_eq!(header["alg"], alg);
        assert_eq!(header["kid"], KEY_ID);
        assert_eq!(header["typ"], "JWT");
        let nonce = header["nonce"].as_str().unwrap();
        assert_eq!(nonce.len(), 32);
        assert!(nonce.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(claims["sub"], KEY_ID);
        assert_eq!(claims["iss"], "cdp");
        assert_eq!(claims["aud"], json!(["cdp_service"]));
        let iat = claims["iat"].as_u64().unwrap();
        assert_eq!(claims["nbf"].as_u64().unwrap(), iat);
        assert_eq!(claims["exp"].as_u64().unwrap(), iat + 120);
        assert_eq!(claims["uris"], json!([uri]));
    }

    #[test]
    fn an_ed25519_token_verifies_with_the_public_key() {
        let (secret, public) = ed25519_secret();
        let auth = CdpAuth::new(KEY_ID, &secret).unwrap();
        assert_eq!(auth.algorithm(), "EdDSA");
        let (header, claims, input, sig) = parts(&auth.authorization("POST", URL).unwrap());
        check_claims(
            &header,
            &claims,
            "EdDSA",
            "POST api.cdp.coinbase.com/platform/v2/x402/verify",
        );
        let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
        public.verify(input.as_bytes(), &sig).unwrap();
        // Tampered claims do not verify.
        assert!(
            public
                .verify(input.replace('.', ".x").as_bytes(), &sig)
                .is_err()
        );
    }

    #[test]
    fn p256_tokens_verify_with_the_public_key_from_sec1_and_pkcs8_pems() {
        let key = p256_key();
        let public = p256::ecdsa::VerifyingKey::from(key.public_key());
        let sec1 = key.to_sec1_pem(p256::pkcs8::LineEnding::LF).unwrap();
        let pkcs8 = key.to_pkcs8_pem(p256::pkcs8::LineEnding::LF).unwrap();
        assert!(sec1.contains("BEGIN EC PRIVATE KEY"));
        assert!(pkcs8.contains("BEGIN PRIVATE KEY"));
        // As an environment file often holds it: one line, literal `\n`.
        let one_line = sec1.replace('\n', "\\n");
        for secret in [sec1.as_str(), pkcs8.as_str(), one_line.as_str()] {
            let auth = CdpAuth::new(KEY_ID, secret).unwrap();
            assert_eq!(auth.algorithm(), "ES256");
            let (header, claims, input, sig) = parts(
                &auth
                    .authorization("GET", &URL.replace("verify", "supported"))
                    .unwrap(),
            );
            check_claims(
                &header,
                &claims,
                "ES256",
                "GET api.cdp.coinbase.com/platform/v2/x402/supported",
            );
            assert_eq!(sig.len(), 64, "ES256 is r || s");
            let sig = p256::ecdsa::Signature::from_slice(&sig).unwrap();
            public.verify(input.as_bytes(), &sig).unwrap();
        }
    }

    #[test]
    fn the_uris_claim_names_method_host_and_path_only() {
        let (secret, _) = ed25519_secret();
        let auth = CdpAuth::new(KEY_ID, &secret).unwrap();
        let uri = |method: &str, url: &str| {
            let (_, claims, _, _) = parts(&auth.authorization(method, url).unwrap());
            claims["uris"][0].as_str().unwrap().to_owned()
        };
        assert_eq!(
            uri(
                "post",
                "https://api.cdp.coinbase.com/platform/v2/x402/settle?x=1#f"
            ),
            "POST api.cdp.coinbase.com/platform/v2/x402/settle"
        );
        assert_eq!(
            uri("GET", "http://user:pw@127.0.0.1:4021/supported"),
            "GET 127.0.0.1:4021/supported"
        );
        assert_eq!(
            uri(
                "GET",
                "https://api.cdp.coinbase.com:443/platform/v2/x402/supported"
            ),
            "GET api.cdp.coinbase.com/platform/v2/x402/supported"
        );
        assert!(matches!(
            auth.authorization("GET", "not a url"),
            Err(AuthError::BadUrl { .. })
        ));
    }

    #[test]
    fn every_request_gets_a_fresh_token() {
        let (secret, _) = ed25519_secret();
        let auth = CdpAuth::new(KEY_ID, &secret).unwrap();
        let a = auth.authorization("POST", URL).unwrap();
        let b = auth.authorization("POST", URL).unwrap();
        assert_ne!(a, b);
        assert_ne!(parts(&a).0["nonce"], parts(&b).0["nonce"]);
        // The same instant, the same request: still another token (the nonce).
        assert_ne!(
            auth.token_at("POST", URL, 1_700_000_000).unwrap(),
            auth.token_at("POST", URL, 1_700_000_000).unwrap()
        );
    }

    #[test]
    fn unusable_secrets_are_refused_in_one_sentence() {
        let message = "CDP_API_KEY_SECRET is neither a base64 Ed25519 key nor a PEM EC P-256 key";
        let short = STANDARD.encode([7u8; 32]);
        let rsa_like = "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n";
        for secret in [
            "not a key",
            short.as_str(),
            rsa_like,
            "-----BEGIN EC PRIVATE KEY-----",
        ] {
            let e = CdpAuth::new(KEY_ID, secret).unwrap_err();
            assert_eq!(e.to_string(), message, "{secret}");
        }
        // An Ed25519 PKCS#8 PEM is not what CDP issues.
        let ed = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
        let mut der = hex::decode("302e020100300506032b657004220420").unwrap();
        der.extend_from_slice(&ed.to_bytes());
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(der)
        );
        assert_eq!(CdpAuth::new(KEY_ID, &pem).unwrap_err().to_string(), message);
        // Halves that do not belong together.
        let (secret, _) = ed25519_secret();
        let mut bytes = STANDARD.decode(secret).unwrap();
        bytes[40] ^= 1;
        let e = CdpAuth::named(KEY_ID, &STANDARD.encode(bytes), "ID", "MY_SECRET").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("MY_SECRET is a 64-byte Ed25519 key whose public half")
        );
        assert_eq!(
            CdpAuth::new(" ", "x").unwrap_err().to_string(),
            "CDP_API_KEY_ID is empty or not set: give it the facilitator credential it names"
        );
    }

    #[test]
    fn neither_credential_shows_its_secret() {
        let (secret, _) = ed25519_secret();
        let auth = CdpAuth::new(KEY_ID, &secret).unwrap();
        assert!(!format!("{auth:?}").contains(&secret));
        let bearer = Bearer::new("tok-123", "FACILITATOR_TOKEN").unwrap();
        assert!(!format!("{bearer:?}").contains("tok-123"));
        assert_eq!(bearer.authorization("GET", URL).unwrap(), "Bearer tok-123");
        assert_eq!(bearer.hint(), "check the token in FACILITATOR_TOKEN");
        assert!(matches!(
            Bearer::new("a\nb", "T"),
            Err(AuthError::BadToken { .. })
        ));
        assert!(matches!(
            Bearer::new("  ", "T"),
            Err(AuthError::Missing { .. })
        ));
    }
}
