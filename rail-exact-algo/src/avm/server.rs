//! The AVM scheme's facilitator over HTTP: `GET /supported`, `POST /verify`, `POST /settle`,
//! as x402's resource servers call a facilitator (x402-avm's `HTTPFacilitatorClient`, this
//! crate's [`super::remote::RemoteFacilitator`]; research §7.1).
//!
//! The routes and the wire are the transport's, the same for every scheme
//! ([`x402_transport::facilitator`]); this file is the scheme's side of the trait:
//! - `/verify` and `/settle` answer **200** for a payment that is refused (`isValid: false`,
//!   `success: false` with the code), as the SDK's client requires; a settle answer always
//!   carries `transaction` and `network`.
//! - An unknown outcome (algod or the settlement store did not answer) is a **503** with
//!   `Retry-After` and no `success`: the same payment presented again settles at most once.
//! - Bodies over 64 KiB are refused (413) before they are read; malformed JSON is a 400 naming
//!   what is wrong; a request without `x402Version` is read as version 2 (the SDK's client may
//!   leave it out); nothing is logged of a payment but its payer and transaction id.
//! - `/supported` lists the network in both spellings (the whole genesis hash for x402-avm,
//!   the 32-character CAIP-2 form for `@x402/avm`), with `extra.feePayer` when this facilitator
//!   pays fees.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use serde_json::json;
use x402_transport::facilitator::{Facilitator, Unavailable};

use super::facilitator::{AvmError, AvmFacilitator};
use super::wire::{
    Envelope, Kind, Requirements, SettleResponse, Spelling, Supported, VerifyResponse,
};

/// The facilitator's routes: the transport's over `f`.
pub fn router(f: AvmFacilitator) -> Router {
    x402_transport::facilitator::router(Arc::new(f))
}

/// `/supported`'s answer for `f`.
#[must_use]
pub fn supported_of(f: &AvmFacilitator) -> Supported {
    let extra = f.fee_payer().map(|a| json!({"feePayer": a.to_string()}));
    let kinds = [Spelling::GenesisHash, Spelling::Caip2]
        .into_iter()
        .map(|s| Kind {
            x402_version: 2,
            scheme: "exact".into(),
            network: s.network(&f.genesis_hash()),
            extra: extra.clone(),
        })
        .collect();
    let mut signers = BTreeMap::new();
    if let Some(a) = f.fee_payer() {
        signers.insert("algorand:*".to_owned(), vec![a.to_string()]);
    }
    Supported {
        kinds,
        extensions: Vec::new(),
        signers,
    }
}

#[async_trait]
impl Facilitator for AvmFacilitator {
    type Payload = Envelope;
    type Requirements = Requirements;
    const VERSION_REQUIRED: bool = false;

    async fn verify(
        &self,
        envelope: &Envelope,
        req: &Requirements,
    ) -> Result<VerifyResponse, Unavailable> {
        let invalid = |code: &str, message: String, payer: Option<String>| {
            Ok(VerifyResponse {
                is_valid: false,
                invalid_reason: Some(code.to_owned()),
                invalid_message: Some(message),
                payer,
            })
        };
        let p = match self.check(envelope, req) {
            Ok(p) => p,
            Err(v) => return invalid(v.code, v.detail, None),
        };
        let payer = Some(p.payer.to_string());
        match AvmFacilitator::verify(self, &p).await {
            Ok(true) => Ok(VerifyResponse {
                is_valid: true,
                invalid_reason: None,
                invalid_message: None,
                payer,
            }),
            Ok(false) => invalid(
                super::wire::code::ALREADY_SETTLED,
                "the group is already on chain".into(),
                payer,
            ),
            Err(AvmError::Refused { code, detail }) => invalid(code, detail, payer),
            Err(AvmError::Unknown(detail)) => Err(Unavailable::new(detail)),
        }
    }

    async fn settle(
        &self,
        envelope: &Envelope,
        req: &Requirements,
    ) -> Result<SettleResponse, Unavailable> {
        let network = envelope.accepted.network.clone();
        let failed = |code: &str, message: String, payer: Option<String>| {
            Ok(SettleResponse {
                success: false,
                error_reason: Some(code.to_owned()),
                error_message: Some(message),
                payer,
                transaction: String::new(),
                network: network.clone(),
            })
        };
        let p = match self.check(envelope, req) {
            Ok(p) => p,
            Err(v) => return failed(v.code, v.detail, None),
        };
        let payer = Some(p.payer.to_string());
        match AvmFacilitator::settle(self, &p, &req.network).await {
            Ok(s) => {
                tracing::info!(payer = %s.payer, txid = %s.txid, "exact-avm: settled");
                Ok(SettleResponse {
                    success: true,
                    error_reason: None,
                    error_message: None,
                    payer: Some(s.payer),
                    transaction: s.txid,
                    network: network.clone(),
                })
            }
            Err(AvmError::Refused { code, detail }) => failed(code, detail, payer),
            Err(AvmError::Unknown(detail)) => Err(Unavailable::new(detail)),
        }
    }

    async fn supported(&self) -> Result<Supported, Unavailable> {
        Ok(supported_of(self))
    }
}
