//! The exact-avm rail's own cases ([`conformance::Harness::rail_checks`]): one per rule of the
//! scheme, each a group an attacker built and signed itself around the payee's entry, then the
//! chain's verdicts (a payee not opted in, a frozen holding, an expired window), a replayed
//! group and concurrent submissions of one group — on both tiers. Every refusal must move
//! nothing.

#[allow(clippy::wildcard_imports)] // the harness's parts and imports, as the harness sees them
use super::*;
use rail_exact_algo::avm::AvmError;
use rail_exact_algo::avm::wire::{Envelope, Payload, Requirements, code};
use rail_exact_algo::txn::group_id;

/// A case's verdict.
type Check = Result<(), String>;

/// The price every case pays: 0.01 USDC.
const PRICE: u64 = 10_000;

/// What an attacker shapes: the fee payer's zero self-payment and the transfer, plus extras.
struct Craft {
    fee: PayTxn,
    transfer: AxferTxn,
    extra: Vec<Transaction>,
    signer: SigningKey,
}

impl Craft {
    fn payload(self) -> Payload {
        let mut txns = vec![
            Transaction::Pay(self.fee),
            Transaction::Axfer(self.transfer),
        ];
        txns.extend(self.extra);
        let gid = group_id(&txns);
        let payment_group = txns
            .into_iter()
            .map(|t| t.with_group(Some(gid)))
            .enumerate()
            .map(|(i, t)| {
                if i == 0 {
                    BASE64.encode(&t.encode())
                } else {
                    BASE64.encode(&SignedTxn::sign(t, &self.signer, None).encode())
                }
            })
            .collect();
        Payload {
            payment_group,
            payment_index: 1,
        }
    }
}

impl ExactAvmHarness {
    fn entry(&self) -> Requirements {
        self.scheme.requirements_for(PRICE)
    }

    async fn craft(&self) -> Result<Craft, String> {
        let p = self.algod.params().await.map_err(|e| e.to_string())?;
        let r = p.last_round.max(1);
        let n: u64 = rand::random();
        Ok(Craft {
            fee: PayTxn {
                sender: self.fee_payer,
                receiver: self.fee_payer,
                amount: 0,
                fee: 2 * p.min_fee.max(1000),
                first_valid: r,
                last_valid: r + 1000,
                genesis_id: p.genesis_id.clone(),
                genesis_hash: p.genesis_hash,
                note: format!("x402-fee-payer-{n}").into_bytes(),
                close_to: None,
                rekey_to: None,
                group: None,
                lease: None,
            },
            transfer: AxferTxn {
                sender: addr(&self.payer_key),
                asset: self.asset,
                amount: PRICE,
                receiver: self.payee,
                asset_sender: None,
                close_to: None,
                fee: 0,
                first_valid: r,
                last_valid: r + 1000,
                genesis_id: p.genesis_id,
                genesis_hash: p.genesis_hash,
                note: format!("x402-payment-{n}").into_bytes(),
                rekey_to: None,
                group: None,
                lease: None,
            },
            extra: Vec::new(),
            signer: self.payer_key.clone(),
        })
    }

    fn envelope(req: &Requirements, payload: Payload) -> Envelope {
        Envelope {
            x402_version: 2,
            payload,
            accepted: req.clone(),
            resource: None,
            extensions: None,
        }
    }

    async fn usdc(&self, a: &Address) -> Result<u64, String> {
        self.algod
            .asset_holding(a, self.asset)
            .await
            .map(|h| h.map_or(0, |(n, _)| n))
            .map_err(|e| e.to_string())
    }

    /// `edit` applied to a careful group must be refused offline with `want`, and then by
    /// settlement too (never submitted), moving nothing.
    async fn refused_with(&self, want: &str, edit: impl FnOnce(&mut Craft)) -> Check {
        let mut c = self.craft().await?;
        edit(&mut c);
        let req = self.entry();
        let env = Self::envelope(&req, c.payload());
        let before = (self.usdc(&self.payee).await?, self.usdc(&self.other).await?);
        match self.facilitator.check(&env, &req) {
            Ok(_) => return Err(format!("accepted; expected {want}")),
            Err(v) if v.code != want => {
                return Err(format!(
                    "refused with {} ({}); expected {want}",
                    v.code, v.detail
                ));
            }
            Err(_) => {}
        }
        let after = (self.usdc(&self.payee).await?, self.usdc(&self.other).await?);
        if before != after {
            return Err(format!("money moved: {before:?} → {after:?}"));
        }
        Ok(())
    }

    /// A group that passes the rules but that the chain refuses: `verify` (simulate) and
    /// `settle` both refuse it for certain, with `needle` in the chain's message.
    async fn chain_refuses(&self, req: &Requirements, payload: Payload, needle: &str) -> Check {
        let env = Self::envelope(req, payload);
        let p = self
            .facilitator
            .check(&env, req)
            .map_err(|v| format!("refused offline ({}): {}", v.code, v.detail))?;
        match self.facilitator.verify(&p).await {
            Err(AvmError::Refused { detail, .. }) if detail.contains(needle) => {}
            other => {
                return Err(format!(
                    "verify: {other:?}; expected a refusal naming {needle:?}"
                ));
            }
        }
        match self.facilitator.settle(&p, &req.network).await {
            Err(AvmError::Refused { .. }) => Ok(()),
            other => Err(format!("settle: {other:?}; expected a refusal")),
        }
    }

    async fn not_opted_in(&self) -> Check {
        let stranger = random_key();
        let req = ExactAvm::new(self.facilitator.clone(), addr(&stranger), self.asset, 6)
            .requirements_for(PRICE);
        let mut c = self.craft().await?;
        c.transfer.receiver = addr(&stranger);
        self.chain_refuses(&req, c.payload(), "missing from").await
    }

    async fn frozen(&self) -> Check {
        let payee = self.payee;
        self.control(&format!("/devnet/freeze/{payee}/{}/true", self.asset))
            .await?;
        let c = self.craft().await?;
        let r = self
            .chain_refuses(&self.entry(), c.payload(), "asset frozen in recipient")
            .await;
        self.control(&format!("/devnet/freeze/{payee}/{}/false", self.asset))
            .await?;
        r
    }

    async fn expired(&self) -> Check {
        let mut c = self.craft().await?;
        let r = c.transfer.first_valid;
        c.transfer.last_valid = r + 2;
        c.fee.last_valid = r + 2;
        let req = self.entry();
        let p = self
            .facilitator
            .check(&Self::envelope(&req, c.payload()), &req)
            .map_err(|v| v.to_string())?;
        self.control("/devnet/advance/3").await?;
        match self.facilitator.verify(&p).await {
            Err(AvmError::Refused {
                code: code::EXPIRED,
                ..
            }) => {}
            other => return Err(format!("verify: {other:?}; expected {}", code::EXPIRED)),
        }
        match self.facilitator.settle(&p, &req.network).await {
            Err(AvmError::Refused {
                code: code::EXPIRED,
                ..
            }) => Ok(()),
            other => Err(format!("settle: {other:?}; expected {}", code::EXPIRED)),
        }
    }

    /// Settled once, then presented again: the same settlement answers (no second transfer),
    /// and the transport's served-once record refuses it.
    async fn replayed(&self) -> Check {
        let req = self.entry();
        let p = self
            .facilitator
            .check(&Self::envelope(&req, self.craft().await?.payload()), &req)
            .map_err(|v| v.to_string())?;
        let before = self.usdc(&self.payee).await?;
        let first = self
            .facilitator
            .settle(&p, &req.network)
            .await
            .map_err(|e| e.to_string())?;
        let again = self
            .facilitator
            .settle(&p, &req.network)
            .await
            .map_err(|e| e.to_string())?;
        if first.txid != again.txid {
            return Err(format!("settled twice: {} and {}", first.txid, again.txid));
        }
        let paid = self.usdc(&self.payee).await? - before;
        if paid != PRICE {
            return Err(format!("the payee got {paid}, expected {PRICE} once"));
        }
        let served = ServedOnce::new(Arc::new(MemoryKeyStore::default()));
        let key = p.key(&req.network);
        let r = served.reserve(&key).await.map_err(|e| e.to_string())?;
        x402_transport::served::commit(r).await;
        match served.reserve(&key).await {
            Err(x402_transport::served::Taken::Used) => Ok(()),
            other => Err(format!("served again: {:?}", other.map(|_| ()))),
        }
    }

    /// Eight settlements of one group at once, across two facilitator instances on the same
    /// store: one transfer.
    async fn concurrent(&self) -> Check {
        let req = self.entry();
        let p = self
            .facilitator
            .check(&Self::envelope(&req, self.craft().await?.payload()), &req)
            .map_err(|v| v.to_string())?;
        let before = self.usdc(&self.payee).await?;
        let twin = self.twin_scheme_facilitator();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let f = if i % 2 == 0 {
                self.facilitator.clone()
            } else {
                twin.clone()
            };
            let (p, network) = (p.clone(), req.network.clone());
            tasks.push(tokio::spawn(async move { f.settle(&p, &network).await }));
        }
        let mut ok = 0;
        for t in tasks {
            match t.await.map_err(|e| e.to_string())? {
                Ok(s) if s.txid == p.txid => ok += 1,
                Ok(s) => return Err(format!("another transaction settled: {}", s.txid)),
                Err(AvmError::Unknown(_)) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        if ok == 0 {
            return Err("no settlement succeeded".into());
        }
        let paid = self.usdc(&self.payee).await? - before;
        if paid == PRICE {
            Ok(())
        } else {
            Err(format!("the payee got {paid}, expected {PRICE} once"))
        }
    }

    fn twin_scheme_facilitator(&self) -> AvmFacilitator {
        self.twin_facilitator.clone()
    }

    pub(super) async fn checks(&self) -> Vec<(String, Check)> {
        let stranger = random_key();
        let someone = addr(&stranger);
        let mut out: Vec<(String, Check)> = Vec::new();
        out.push((
            "wrong asset".into(),
            self.refused_with(code::ASSET_ID_MISMATCH, |c| c.transfer.asset += 1)
                .await,
        ));
        out.push((
            "wrong receiver".into(),
            self.refused_with(code::RECIPIENT_MISMATCH, |c| c.transfer.receiver = someone)
                .await,
        ));
        out.push((
            "underpay".into(),
            self.refused_with(code::AMOUNT_INSUFFICIENT, |c| c.transfer.amount -= 1)
                .await,
        ));
        out.push((
            "asset close-to on the transfer".into(),
            self.refused_with(code::CLOSE_TO_DETECTED, |c| {
                c.transfer.close_to = Some(someone);
            })
            .await,
        ));
        out.push((
            "rekey on the transfer".into(),
            self.refused_with(code::REKEY_DETECTED, |c| {
                c.transfer.rekey_to = Some(someone);
            })
            .await,
        ));
        out.push((
            "close-to on the fee payer's transaction".into(),
            self.refused_with(code::FEE_PAYER_HAS_CLOSE, |c| {
                c.fee.close_to = Some(someone);
            })
            .await,
        ));
        out.push((
            "rekey on the fee payer's transaction".into(),
            self.refused_with(code::FEE_PAYER_HAS_REKEY, |c| {
                c.fee.rekey_to = Some(someone);
            })
            .await,
        ));
        out.push((
            "a fee-payer transaction that pays someone".into(),
            self.refused_with(code::FEE_PAYER_INVALID_TXN, |c| c.fee.receiver = someone)
                .await,
        ));
        out.push((
            "a fee-payer transaction that moves ALGO".into(),
            self.refused_with(code::FEE_PAYER_HAS_AMOUNT, |c| c.fee.amount = 1)
                .await,
        ));
        out.push((
            "a fee-payer transaction over the fee cap".into(),
            self.refused_with(code::FEE_PAYER_INVALID_TXN, |c| c.fee.fee = 16_001)
                .await,
        ));
        out.push((
            "a group over 16".into(),
            self.refused_with(code::GROUP_TOO_LARGE, |c| {
                for i in 0..15u8 {
                    let mut t = c.transfer.clone();
                    t.amount = 0;
                    t.receiver = t.sender;
                    t.note = vec![i + 1];
                    c.extra.push(Transaction::Axfer(t));
                }
            })
            .await,
        ));
        out.push((
            "a forged signature".into(),
            self.refused_with(code::INVALID_SIGNATURE, |c| c.signer = stranger.clone())
                .await,
        ));
        out.push((
            "another chain".into(),
            self.refused_with(code::GENESIS_HASH_MISMATCH, |c| {
                c.transfer.genesis_hash = [7; 32];
            })
            .await,
        ));
        out.push(("a payee not opted in".into(), self.not_opted_in().await));
        out.push(("a frozen holding".into(), self.frozen().await));
        out.push(("an expired window".into(), self.expired().await));
        out.push(("a replayed group".into(), self.replayed().await));
        out.push((
            "concurrent duplicate submissions settle once".into(),
            self.concurrent().await,
        ));
        out
    }
}
