//! The audit chain (I5): mandate → (confirmation) → quote → proof → receipt, verified offline.
//!
//! [`verify_chain`] takes the compact JWS of one payment's objects (in any order) and checks
//! every signature and every link, naming the first broken one:
//!
//! | link | checked |
//! |---|---|
//! | `mandate` | signature; signed by the trusted principal, if one is given |
//! | `confirmation` | signed by the mandate's wallet key; binds the mandate and the quote |
//! | `quote` | signed by its receiver; the receiver (id and key) is in the mandate's allowlist; a Quote naming its `resource` was served at an origin the entry pins (when it pins any); issued while the mandate was valid |
//! | `proof` | signed by the mandate's wallet key; binds the mandate, the quote and the confirmation; paid before the quote expired, while the mandate was valid; amount = the quote's (I3); a rail the quote accepts and the mandate allows; within the per-call limit; confirmed where the mandate or the profile requires it |
//! | `receipt` | signed by the quote's receiver; binds the proof; the final amount never above the quote, the proof or the confirmation (I3); a service receipt takes exactly the quoted amount |
//!
//! Limits over many payments (per period, total, per receiver) are not provable from one
//! chain; the wallet's store enforces them. Revocations are not part of a chain: an auditor
//! holding the principal's checks them with [`Chain::check_revocations`]
//! (`stipendex verify-chain --revocation FILE`).

mod tab;

use rail_core::Amount;
use rail_core::clock::rfc3339;

pub use tab::{TabChain, TabVerifier, result_line, uncounted_line, verify_tab_chain};

use crate::Error;
use crate::envelope::{
    Allow, Confirmation, Mandate, Object, Profile, Proof, PublicKey, Quote, Receipt, Revocation,
    Signed, jws,
};

/// A chain that verified.
#[derive(Clone, Debug)]
pub struct Chain {
    /// The mandate.
    pub mandate: Signed<Mandate>,
    /// The confirmation, if a human confirmed.
    pub confirmation: Option<Signed<Confirmation>>,
    /// The quote (absent when the proof pays an unsigned x402 challenge).
    pub quote: Option<Signed<Quote>>,
    /// The proof.
    pub proof: Signed<Proof>,
    /// The receipt (absent: the receiver has not answered yet).
    pub receipt: Option<Signed<Receipt>>,
}

impl Chain {
    /// Checks the chain against `revocations` (the principal's, as an auditor holds them): a
    /// Proof made at or after the revocation of its mandate breaks the chain at the proof. A
    /// revocation of another mandate, or not signed by this mandate's principal, has no
    /// bearing on it.
    ///
    /// # Errors
    /// [`Error::Broken`] at `proof`.
    pub fn check_revocations(&self, revocations: &[Signed<Revocation>]) -> Result<(), Error> {
        let m = self.mandate.object();
        let p = self.proof.object();
        for r in revocations {
            let rv = r.object();
            if &rv.mandate == self.mandate.digest()
                && rv.principal == m.principal.key
                && p.iat >= rv.iat
            {
                return Err(broken(
                    "proof",
                    format!(
                        "made at {} under mandate {}, which its principal revoked at {} ({})",
                        rfc3339(p.iat),
                        m.id,
                        rfc3339(rv.iat),
                        rv.id
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn broken(link: &'static str, why: impl Into<String>) -> Error {
    Error::Broken {
        link,
        why: why.into(),
    }
}

/// That `link` (a Proof, a Confirmation), which names `wallet` as its signer and binds the
/// mandate `bound`, was made under the mandate `md` (whose digest is `mandate_digest`): by
/// its wallet, binding it.
fn signed_under(
    link: &'static str,
    wallet: &crate::envelope::PublicKey,
    bound: &crate::envelope::Digest,
    md: &Mandate,
    mandate_digest: &crate::envelope::Digest,
) -> Result<(), Error> {
    if wallet != &md.wallet {
        return Err(broken(
            link,
            format!("signed by {wallet}, not the mandate's wallet {}", md.wallet),
        ));
    }
    if bound != mandate_digest {
        return Err(broken(link, "does not bind this mandate"));
    }
    Ok(())
}

/// The type an object claims (`mandate`, `quote`, `tab`, `voucher`…), read without trusting
/// it: to name a link whose signature fails, or to tell a tab's chain from a payment's before
/// verifying it.
#[must_use]
pub fn claimed_kind(compact: &str) -> Option<String> {
    use base64::Engine as _;
    let payload = compact.trim().split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let tag = v.get("stipendex")?.as_str()?;
    Some(tag.split('/').next()?.to_owned())
}

fn link_name(kind: &str) -> &'static str {
    match kind {
        "mandate" => "mandate",
        "confirmation" => "confirmation",
        "quote" => "quote",
        "proof" => "proof",
        "receipt" => "receipt",
        "tab" => "tab",
        "voucher" => "voucher",
        "tab-receipt" => "tab-receipt",
        _ => "object",
    }
}

fn one<T: Object>(
    link: &'static str,
    found: &mut Option<Signed<T>>,
    compact: &str,
) -> Result<(), Error> {
    let s = Signed::<T>::parse(compact).map_err(|e| broken(link, e.to_string()))?;
    if found.is_some() {
        return Err(broken(link, format!("the chain holds two {link} objects")));
    }
    *found = Some(s);
    Ok(())
}

/// Verifies one payment's chain from its objects (compact JWS, any order). `principal`, if
/// given, is the trust anchor the mandate must be signed by.
///
/// # Errors
/// [`Error::Broken`] naming the first broken link (`mandate`, `confirmation`, `quote`,
/// `proof`, `receipt`) and why.
pub fn verify_chain(objects: &[&str], principal: Option<&PublicKey>) -> Result<Chain, Error> {
    let (mut m, mut c, mut q, mut p, mut r) = (None, None, None, None, None);
    for (i, o) in objects.iter().enumerate() {
        let verified = jws::verify(o.trim()).map_err(|e| {
            let link = claimed_kind(o).map_or("object", |k| link_name(&k));
            broken(link, format!("object {} of the chain: {e}", i + 1))
        });
        verified?;
        match claimed_kind(o).as_deref() {
            Some("mandate") => one("mandate", &mut m, o)?,
            Some("confirmation") => one("confirmation", &mut c, o)?,
            Some("quote") => one("quote", &mut q, o)?,
            Some("proof") => one("proof", &mut p, o)?,
            Some("receipt") => one("receipt", &mut r, o)?,
            other => {
                return Err(broken(
                    "object",
                    format!(
                        "object {} of the chain is a {}, not a chain object",
                        i + 1,
                        other.unwrap_or("(no type)")
                    ),
                ));
            }
        }
    }
    let mandate: Signed<Mandate> = m.ok_or_else(|| broken("mandate", "missing"))?;
    let proof: Signed<Proof> = p.ok_or_else(|| broken("proof", "missing"))?;
    let md = mandate.object();
    if let Some(anchor) = principal
        && &md.principal.key != anchor
    {
        return Err(broken(
            "mandate",
            format!(
                "signed by {}, not the trusted principal {anchor}",
                md.principal.key
            ),
        ));
    }
    let conf: Option<Signed<Confirmation>> = c;
    if let Some(challenge) = &proof.object().challenge {
        if q.is_some() || r.is_some() {
            return Err(broken(
                "proof",
                "pays an unsigned challenge, yet the chain holds a quote or a receipt",
            ));
        }
        check_challenge(&mandate, conf.as_ref(), &proof, challenge)?;
        return Ok(Chain {
            mandate,
            confirmation: conf,
            quote: None,
            proof,
            receipt: None,
        });
    }
    let quote: Signed<Quote> = q.ok_or_else(|| broken("quote", "missing"))?;
    if let Some(c) = &conf {
        check_confirmation(md, mandate.digest(), &quote, c.object())?;
    }
    check_quote(md, quote.object())?;
    check_proof(&mandate, &quote, conf.as_ref(), &proof)?;
    let receipt: Option<Signed<Receipt>> = r;
    if let Some(rc) = &receipt {
        check_receipt(
            quote.object(),
            &proof,
            conf.as_ref().map(Signed::object),
            rc,
        )?;
    }
    Ok(Chain {
        mandate,
        confirmation: conf,
        quote: Some(quote),
        proof,
        receipt,
    })
}

/// Whether `allow` lets the wallet pay `challenge` (origin or server, and `payTo`; an EVM
/// address compares without case).
#[must_use]
pub fn challenge_allowed(allow: &[Allow], challenge: &crate::envelope::Challenge) -> bool {
    use crate::envelope::ChallengeSource;
    let same_pay_to = |a: &str| {
        if a.starts_with("0x") || a.starts_with("0X") {
            a.eq_ignore_ascii_case(&challenge.pay_to)
        } else {
            a == challenge.pay_to
        }
    };
    allow.iter().any(|a| match (a, challenge.source) {
        (Allow::X402Http { origin, pay_to }, ChallengeSource::Http) => {
            origin
                .trim_end_matches('/')
                .eq_ignore_ascii_case(&challenge.origin)
                && same_pay_to(pay_to)
        }
        (Allow::X402Mcp { server, pay_to }, ChallengeSource::Mcp) => {
            server == &challenge.origin && same_pay_to(pay_to)
        }
        (Allow::Contextvm { server }, ChallengeSource::Contextvm) => {
            server.len() == 64 && server.eq_ignore_ascii_case(&challenge.origin)
        }
        _ => false,
    })
}

/// The checks every proof gets, whatever it pays: signed by the mandate's wallet, binding the
/// mandate and the chain's confirmation, made while the mandate was valid, in an asset the
/// mandate limits and within its per-call limit, and confirmed where the mandate (or `must_confirm`,
/// the checkout profile) requires it. Returns the amount paid.
fn check_under_mandate(
    mandate: &Signed<Mandate>,
    conf: Option<&Signed<Confirmation>>,
    proof: &Signed<Proof>,
    must_confirm: bool,
) -> Result<rail_core::Money, Error> {
    check_proof_under(mandate, conf, proof, must_confirm, true)
}

/// [`check_under_mandate`]; `per_call`: whether the mandate's per-call limit applies to the
/// Proof's amount (not to a tab's cap: it applies to each of its calls).
fn check_proof_under(
    mandate: &Signed<Mandate>,
    conf: Option<&Signed<Confirmation>>,
    proof: &Signed<Proof>,
    must_confirm: bool,
    per_call: bool,
) -> Result<rail_core::Money, Error> {
    let link = "proof";
    let (md, p) = (mandate.object(), proof.object());
    signed_under(link, &p.wallet, &p.mandate, md, mandate.digest())?;
    if p.confirmation.as_ref() != conf.map(Signed::digest) {
        return Err(broken(link, "does not bind this chain's confirmation"));
    }
    if p.iat < md.nbf || p.iat >= md.exp {
        return Err(broken(
            link,
            format!(
                "paid at {}, outside the mandate's validity ({} until {})",
                rfc3339(p.iat),
                rfc3339(md.nbf),
                rfc3339(md.exp)
            ),
        ));
    }
    let paid = p.money().map_err(|e| broken(link, e.to_string()))?;
    let Some(limits) = md.limits_for(paid.asset()) else {
        return Err(broken(
            link,
            format!("the mandate allows no spending in {}", paid.asset()),
        ));
    };
    if per_call && limits.per_call.is_some_and(|l| paid.amount() > l) {
        return Err(broken(link, "above the mandate's per-call limit"));
    }
    let needs = must_confirm || limits.confirm_above.is_some_and(|t| paid.amount() > t);
    if needs && conf.is_none() {
        return Err(broken(
            link,
            "the mandate requires a confirmation for this payment; there is none",
        ));
    }
    Ok(paid)
}

/// What a wallet paid for a ContextVM server's CEP-8 payment request is what it asked: for
/// `bitcoin-lightning-bolt11`, its `amount` in satoshis is the BTC paid (exactly, in msat), and
/// the payee recorded is the invoice's node (checked where the `ln-nwc` feature decodes it).
fn check_cep8_entry(
    challenge: &crate::envelope::Challenge,
    paid: &rail_core::Money,
) -> Result<(), Error> {
    let entry = &challenge.entry;
    let pmi = entry.get("pmi").and_then(serde_json::Value::as_str);
    if pmi != Some("bitcoin-lightning-bolt11") {
        return Err(broken(
            "proof",
            format!(
                "pays a ContextVM payment request of payment method {pmi:?}, which this verifier does not know"
            ),
        ));
    }
    let sats = entry.get("amount").and_then(serde_json::Value::as_u64);
    let asked = sats.map(|s| u128::from(s) * 1000);
    if *paid.asset() != rail_core::Asset::btc() || asked != Some(paid.minor_units()) {
        return Err(broken(
            "proof",
            format!(
                "pays {} {}; its payment request asks {} sats",
                paid.amount(),
                paid.asset(),
                sats.map_or_else(|| "no amount".to_owned(), |s| s.to_string())
            ),
        ));
    }
    #[cfg(feature = "ln-nwc")]
    {
        let invoice = entry
            .get("pay_req")
            .and_then(serde_json::Value::as_str)
            .and_then(|i| i.trim().parse::<lightning_invoice::Bolt11Invoice>().ok())
            .ok_or_else(|| broken("proof", "its payment request holds no BOLT11 invoice"))?;
        if invoice.recover_payee_pub_key().to_string() != challenge.pay_to {
            return Err(broken(
                "proof",
                format!(
                    "records payee {}, which is not its invoice's",
                    challenge.pay_to
                ),
            ));
        }
    }
    Ok(())
}

fn check_challenge(
    mandate: &Signed<Mandate>,
    conf: Option<&Signed<Confirmation>>,
    proof: &Signed<Proof>,
    challenge: &crate::envelope::Challenge,
) -> Result<(), Error> {
    let md = mandate.object();
    if !challenge_allowed(&md.allow, challenge) {
        return Err(broken(
            "proof",
            format!(
                "pays {} at {}, which the mandate's allowlist does not name",
                challenge.pay_to, challenge.origin
            ),
        ));
    }
    let paid = check_under_mandate(mandate, conf, proof, false)?;
    if challenge.source == crate::envelope::ChallengeSource::Contextvm {
        check_cep8_entry(challenge, &paid)?;
    } else {
        // What was paid is what the challenge's entry asked, to whom it named.
        let entry = &challenge.entry;
        if entry.get("payTo").and_then(serde_json::Value::as_str) != Some(challenge.pay_to.as_str())
        {
            return Err(broken(
                "proof",
                format!(
                    "records payTo {}, which is not its challenge entry's",
                    challenge.pay_to
                ),
            ));
        }
        let asked = entry
            .get("amount")
            .or_else(|| entry.get("maxAmountRequired"))
            .and_then(serde_json::Value::as_str)
            .and_then(|a| a.parse::<u128>().ok());
        if asked != Some(paid.minor_units()) {
            return Err(broken(
                "proof",
                format!(
                    "pays {} {} ({} minor units); its challenge entry asks {}",
                    paid.amount(),
                    paid.asset(),
                    paid.minor_units(),
                    asked.map_or_else(|| "no amount".to_owned(), |a| format!("{a} minor units"))
                ),
            ));
        }
    }
    match conf {
        None => Ok(()),
        Some(c) => {
            let co = c.object();
            if co.wallet != md.wallet
                || &co.mandate != mandate.digest()
                || co.quote != challenge.digest()
            {
                return Err(broken(
                    "confirmation",
                    "does not bind this mandate and challenge",
                ));
            }
            let max = co
                .max()
                .map_err(|e| broken("confirmation", e.to_string()))?;
            if max.asset() != paid.asset() || max.amount() < paid.amount() {
                return Err(broken("confirmation", "consents to less than was paid"));
            }
            Ok(())
        }
    }
}

fn check_confirmation(
    md: &Mandate,
    mandate_digest: &crate::envelope::Digest,
    quote: &Signed<Quote>,
    c: &Confirmation,
) -> Result<(), Error> {
    let link = "confirmation";
    signed_under(link, &c.wallet, &c.mandate, md, mandate_digest)?;
    if &c.quote != quote.digest() || c.quote_id != quote.object().id {
        return Err(broken(link, "does not bind this quote"));
    }
    let max = c.max().map_err(|e| broken(link, e.to_string()))?;
    let qmax = quote
        .object()
        .max()
        .map_err(|e| broken("quote", e.to_string()))?;
    if max.asset() != qmax.asset() || max.amount() < qmax.amount() {
        return Err(broken(
            link,
            format!(
                "consents to {} {}, less than the quote's {} {}",
                max.amount(),
                max.asset(),
                qmax.amount(),
                qmax.asset()
            ),
        ));
    }
    Ok(())
}

fn check_quote(md: &Mandate, q: &Quote) -> Result<(), Error> {
    let mut entries = md.allow.iter().filter_map(|a| match a {
        Allow::Receiver { id, key, origins } if id == &q.receiver.id && key == &q.receiver.key => {
            Some(origins)
        }
        _ => None,
    });
    let Some(first) = entries.next() else {
        return Err(broken(
            "quote",
            format!(
                "receiver {} (key {}) is not in the mandate's allowlist",
                q.receiver.id, q.receiver.key
            ),
        ));
    };
    // A Quote naming where it was served must be served at an origin the mandate pins (when
    // the entry pins any: an entry without origins is not payable over HTTP).
    let origins: Vec<&String> = std::iter::once(first).chain(entries).flatten().collect();
    if let Some(r) = &q.resource
        && !origins.is_empty()
        && !origins.iter().any(|o| **o == r.origin)
    {
        return Err(broken(
            "quote",
            format!(
                "served at {}, which the mandate does not pin for receiver {}",
                r.origin, q.receiver.id
            ),
        ));
    }
    if q.iat < md.nbf || q.iat >= md.exp {
        return Err(broken(
            "quote",
            format!(
                "issued at {}, outside the mandate's validity ({} until {})",
                rfc3339(q.iat),
                rfc3339(md.nbf),
                rfc3339(md.exp)
            ),
        ));
    }
    Ok(())
}

fn check_proof(
    mandate: &Signed<Mandate>,
    quote: &Signed<Quote>,
    conf: Option<&Signed<Confirmation>>,
    proof: &Signed<Proof>,
) -> Result<(), Error> {
    let link = "proof";
    let (md, q, p) = (mandate.object(), quote.object(), proof.object());
    if p.quote.as_ref() != Some(quote.digest()) {
        return Err(broken(link, "does not bind this quote"));
    }
    if p.iat >= q.exp {
        return Err(broken(
            link,
            format!(
                "paid at {}, after the quote expired at {}",
                rfc3339(p.iat),
                rfc3339(q.exp)
            ),
        ));
    }
    if p.iat < q.iat {
        return Err(broken(
            link,
            format!(
                "paid at {}, before the quote was issued at {}",
                rfc3339(p.iat),
                rfc3339(q.iat)
            ),
        ));
    }
    let mode = match q.profile {
        Profile::Service => rail_core::PaymentMode::Capture,
        Profile::Checkout => rail_core::PaymentMode::Hold,
    };
    if p.mode != mode {
        return Err(broken(
            link,
            format!(
                "pays in {} mode; a {:?} quote is paid in {mode} mode",
                p.mode, q.profile
            ),
        ));
    }
    let paid = check_under_mandate(mandate, conf, proof, q.profile == Profile::Checkout)?;
    let max = q.max().map_err(|e| broken("quote", e.to_string()))?;
    if paid != max {
        return Err(broken(
            link,
            format!(
                "pays {} {}, the quote asks {} {}",
                paid.amount(),
                paid.asset(),
                max.amount(),
                max.asset()
            ),
        ));
    }
    let Some(offer) = q.offer(&p.rail) else {
        return Err(broken(
            link,
            format!("pays over {}, which the quote does not accept", p.rail),
        ));
    };
    if p.payment.offer_id != offer.id {
        return Err(broken(
            link,
            "its payment is for another offer than the quote's",
        ));
    }
    if let Some(rails) = &md.rails
        && !rails.contains(&p.rail)
    {
        return Err(broken(
            link,
            format!("pays over {}, which the mandate does not allow", p.rail),
        ));
    }
    Ok(())
}

/// Checks that `receipt` answers `proof` for `quote`: signed by the quote's receiver, binding
/// the proof, never above the quote, the proof or the confirmation (I3); a service receipt
/// takes exactly the quoted amount.
///
/// # Errors
/// [`Error::Broken`] with link `receipt`.
pub fn check_receipt(
    quote: &Quote,
    proof: &Signed<Proof>,
    confirmation: Option<&Confirmation>,
    receipt: &Signed<Receipt>,
) -> Result<(), Error> {
    let link = "receipt";
    let r = receipt.object();
    if r.receiver != quote.receiver {
        return Err(broken(
            link,
            format!(
                "signed by {} ({}), not the quote's receiver {}",
                r.receiver.id, r.receiver.key, quote.receiver.id
            ),
        ));
    }
    if &r.proof != proof.digest() || r.quote_id != quote.id {
        return Err(broken(link, "does not bind this proof"));
    }
    if r.rail != proof.object().rail {
        return Err(broken(link, "names another rail than the proof"));
    }
    let taken = r.money().map_err(|e| broken(link, e.to_string()))?;
    let max = quote.max().map_err(|e| broken("quote", e.to_string()))?;
    let paid = proof
        .object()
        .money()
        .map_err(|e| broken("proof", e.to_string()))?;
    let mut ceilings = vec![("the quote", max.clone()), ("the proof", paid)];
    if let Some(c) = confirmation {
        ceilings.push((
            "the confirmation",
            c.max().map_err(|e| broken("confirmation", e.to_string()))?,
        ));
    }
    for (what, ceiling) in ceilings {
        if taken.asset() != ceiling.asset() || taken.amount() > ceiling.amount() {
            return Err(broken(
                link,
                format!(
                    "takes {} {}, above {what}'s {} {}",
                    taken.amount(),
                    taken.asset(),
                    ceiling.amount(),
                    ceiling.asset()
                ),
            ));
        }
    }
    if quote.profile == Profile::Service && taken.amount() != max.amount() {
        return Err(broken(
            link,
            format!(
                "a service receipt takes the quoted {}, not {}",
                max.amount(),
                taken.amount()
            ),
        ));
    }
    if taken.amount() == Amount::ZERO && quote.profile == Profile::Service {
        return Err(broken(link, "takes nothing for a paid service"));
    }
    Ok(())
}
