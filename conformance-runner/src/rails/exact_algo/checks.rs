//! The exact-algo rail's own cases ([`conformance::Harness::rail_checks`]): one per rule of
//! `docs/exact-algo.md` §3 and per error code, each built as a careful payer would and then changed
//! in one way, on both tiers.

#[allow(clippy::wildcard_imports)] // the harness's parts and imports, as the harness sees them
use super::*;

/// How the finer case `code` goes on the wire (`docs/exact-algo.md` §4): every refusal's `error`
/// is one of the six codes (a case one of them names is sent as itself), the finer code is the
/// `reason` beside it.
/// Written out here, apart from the rail's own table, so a change of either is caught.
fn wire_code(code: &'static str) -> ErrorCode {
    match code {
        c if SEED_ERRORS.contains(&c) => ErrorCode::seed(c),
        "transaction not yet valid" | "validity window too long" => {
            ErrorCode::finer(TRANSACTION_EXPIRED, code)
        }
        "note mismatch" => ErrorCode::finer(UNKNOWN_OR_EXPIRED_PAYMENT_ID, code),
        // Signature, signer, type, group, multisig, logicsig, encoding, envelope, fee, rekey,
        // close-to, network: check the wallet and retry.
        _ => ErrorCode::finer(SETTLEMENT_FAILED, code),
    }
}

/// A case's verdict.
type Check = Result<(), String>;

impl ExactAlgoHarness {
    fn price(amount: u64) -> Price {
        Price {
            resource: "conformance:/paid".into(),
            description: "a conformance case".into(),
            amount,
        }
    }

    /// A signed payment built as a careful payer would, then changed by `edit` before signing.
    async fn build(
        &self,
        key: &SigningKey,
        pid: &str,
        amount: u64,
        edit: impl FnOnce(&mut PayTxn),
    ) -> Result<PayTxn, String> {
        let p = self.algod.params().await.map_err(|e| e.to_string())?;
        let mut t = PayTxn {
            sender: addr(key),
            receiver: self.payee,
            amount,
            fee: p.min_fee.max(1000),
            first_valid: p.last_round.max(1),
            last_valid: p.last_round.max(1) + 1000,
            genesis_id: p.genesis_id,
            genesis_hash: p.genesis_hash,
            note: pid.as_bytes().to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        };
        edit(&mut t);
        Ok(t)
    }

    /// A fresh challenge for 1000 µALGO, and the careful payer's payment of `amount` for it.
    async fn paid_by_payer(
        &self,
        amount: u64,
    ) -> Result<(Price, String, rail_exact_algo::txn::SignedPay), String> {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        let s = self
            .build(&self.payer_key, &pid, amount, |_| {})
            .await?
            .sign(&self.payer_key, None);
        Ok((price, pid, s))
    }

    fn envelope(&self, bytes: &[u8]) -> String {
        header(&Envelope {
            x402_version: 2,
            scheme: "exact".into(),
            network: self.receiver.network().to_owned(),
            payload: Payload {
                txn: BASE64.encode(bytes),
            },
        })
        .unwrap_or_default()
    }

    async fn pid(&self, price: &Price) -> Result<String, String> {
        Ok(self
            .receiver
            .challenge(price)
            .await
            .map_err(|e| e.to_string())?
            .extra
            .payment_id)
    }

    async fn chain_balances(&self) -> Result<(u64, u64), String> {
        let p = self
            .algod
            .account(&addr(&self.payer_key))
            .await
            .map_err(|e| e.to_string())?;
        let q = self
            .algod
            .account(&self.payee)
            .await
            .map_err(|e| e.to_string())?;
        Ok((p.amount, q.amount))
    }

    /// Settles `hdr` for `price` and expects refusal `code` (its finest code) with no money
    /// moving, sent on the wire under the six-code `error` [`wire_code`] names.
    async fn expect_refused(
        &self,
        hdr: &str,
        price: &Price,
        expect: Option<&str>,
        code: &'static str,
    ) -> Check {
        let want = wire_code(code);
        let before = self.chain_balances().await?;
        match self.receiver.settle(hdr, price, expect).await {
            Ok(r) => return Err(format!("accepted ({r:?}); expected {want:?}")),
            Err(e) if e.error_code() == want && SEED_ERRORS.contains(&e.code()) => {}
            Err(e) => {
                return Err(format!("expected {want:?}, got {:?} ({e})", e.error_code()));
            }
        }
        let after = self.chain_balances().await?;
        if before != after {
            return Err(format!(
                "balances moved on a refusal: {before:?} -> {after:?}"
            ));
        }
        Ok(())
    }

    /// One case: a transaction made by `edit` must be refused with `code`.
    async fn rule_case(&self, code: &'static str, edit: impl FnOnce(&mut PayTxn)) -> Check {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        let t = self.build(&self.payer_key, &pid, 1000, edit).await?;
        let s = t.sign(&self.payer_key, None);
        self.expect_refused(&self.envelope(&s.encode()), &price, None, code)
            .await
    }

    pub(super) async fn checks(&self) -> Vec<(String, Check)> {
        let mut out: Vec<(String, Check)> = Vec::new();
        let other = self.other;

        // --- Every rule of `docs/exact-algo.md` §3, each with its own error code.
        out.push((
            "underpaid".into(),
            self.rule_case("underpaid", |t| t.amount = 999).await,
        ));
        out.push((
            "receiver mismatch".into(),
            self.rule_case("receiver mismatch", |t| t.receiver = other)
                .await,
        ));
        out.push((
            "fee above 2000".into(),
            self.rule_case("fee too high", |t| t.fee = 2001).await,
        ));
        out.push((
            "fee below the minimum".into(),
            self.rule_case("fee too low", |t| t.fee = 999).await,
        ));
        out.push((
            "rekey".into(),
            self.rule_case("rekey not allowed", |t| t.rekey_to = Some(other))
                .await,
        ));
        out.push((
            "close-to".into(),
            self.rule_case("close-to not allowed", |t| t.close_to = Some(other))
                .await,
        ));
        out.push((
            "grouped".into(),
            self.rule_case("group not allowed", |t| t.group = Some([7; 32]))
                .await,
        ));
        out.push((
            "another genesis hash".into(),
            self.rule_case("wrong network", |t| t.genesis_hash = [1; 32])
                .await,
        ));
        out.push((
            "last valid round passed".into(),
            self.rule_case("transaction expired", |t| {
                // first_valid is the current round: the next block is past last_valid.
                t.last_valid = t.first_valid;
                t.first_valid = t.last_valid.saturating_sub(10).max(1);
            })
            .await,
        ));
        out.push((
            "first valid round ahead".into(),
            self.rule_case("transaction not yet valid", |t| {
                t.first_valid += 10;
                t.last_valid = t.first_valid + 10;
            })
            .await,
        ));
        out.push((
            "window above 1000 rounds".into(),
            self.rule_case("validity window too long", |t| {
                t.last_valid = t.first_valid + 1001;
            })
            .await,
        ));
        out.push((
            "note is not a paymentId".into(),
            self.rule_case("unknown or expired paymentId", |t| {
                t.note = b"not a payment id".to_vec();
            })
            .await,
        ));
        out.push(("bad signature".into(), self.bad_signature().await));
        out.push(("foreign signer".into(), self.foreign_signer().await));
        out.push((
            "note of another paymentId".into(),
            self.note_mismatch().await,
        ));
        out.push(("expired paymentId".into(), self.expired_pid().await));
        out.push(("paymentId already used".into(), self.used_pid().await));
        out.push(("same payment sent twice".into(), self.sent_twice().await));
        out.push(("settlement failed".into(), self.settlement_failed().await));
        out.push((
            "already on chain (settler crashed after submit)".into(),
            self.already_on_chain().await,
        ));
        out.push((
            "rekeyed account with sgnr".into(),
            self.rekeyed_account().await,
        ));
        out.push(("envelope variants".into(), self.envelopes().await));
        out.push((
            "network spelled with the whole genesis hash".into(),
            self.whole_hash_network().await,
        ));
        out.push(("encoding variants".into(), self.encodings().await));
        out.push(("overpayment accepted".into(), self.overpaid().await));
        out
    }

    async fn bad_signature(&self) -> Check {
        let (price, _, mut s) = self.paid_by_payer(1000).await?;
        if let Some(b) = s.sig.get_mut(5) {
            *b ^= 1;
        }
        self.expect_refused(&self.envelope(&s.encode()), &price, None, "bad signature")
            .await
    }

    async fn foreign_signer(&self) -> Check {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        let t = self.build(&self.payer_key, &pid, 1000, |_| {}).await?;
        let thief = random_key();
        // Signed by another key, without claiming it: the signature does not verify.
        let s = t.clone().sign(&thief, None);
        self.expect_refused(&self.envelope(&s.encode()), &price, None, "bad signature")
            .await?;
        // Claiming the other key as the authorized signer: algod says it is not.
        let s = t.sign(&thief, Some(addr(&thief)));
        self.expect_refused(
            &self.envelope(&s.encode()),
            &price,
            None,
            "unauthorized signer",
        )
        .await
    }

    async fn note_mismatch(&self) -> Check {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        let expected = self.pid(&price).await?;
        let s = self
            .build(&self.payer_key, &pid, 1000, |_| {})
            .await?
            .sign(&self.payer_key, None);
        self.expect_refused(
            &self.envelope(&s.encode()),
            &price,
            Some(&expected),
            "note mismatch",
        )
        .await
    }

    async fn expired_pid(&self) -> Check {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        self.clock
            .advance(self.receiver.max_timeout() + Duration::from_secs(1));
        let s = self
            .build(&self.payer_key, &pid, 1000, |_| {})
            .await?
            .sign(&self.payer_key, None);
        self.expect_refused(
            &self.envelope(&s.encode()),
            &price,
            None,
            "unknown or expired paymentId",
        )
        .await
    }

    async fn settle_ok(&self, hdr: &str, price: &Price) -> Check {
        self.receiver
            .settle(hdr, price, None)
            .await
            .map(|_| ())
            .map_err(|e| format!("a valid payment was refused: {} ({e})", e.code()))
    }

    async fn used_pid(&self) -> Check {
        let (price, pid, s) = self.paid_by_payer(1000).await?;
        self.settle_ok(&self.envelope(&s.encode()), &price).await?;
        // Another transaction with the same paymentId (a different amount, so another txid).
        let s2 = self
            .build(&self.payer_key, &pid, 1001, |_| {})
            .await?
            .sign(&self.payer_key, None);
        self.expect_refused(
            &self.envelope(&s2.encode()),
            &price,
            None,
            "paymentId already used",
        )
        .await
    }

    async fn sent_twice(&self) -> Check {
        let (price, _, s) = self.paid_by_payer(1000).await?;
        let hdr = self.envelope(&s.encode());
        let before = self.chain_balances().await?;
        let (a, b) = futures::join!(
            self.receiver.settle(&hdr, &price, None),
            self.receiver.settle(&hdr, &price, None)
        );
        if usize::from(a.is_ok()) + usize::from(b.is_ok()) != 1 {
            return Err(format!(
                "two concurrent settlements of one payment: {a:?} / {b:?}"
            ));
        }
        self.expect_refused(&hdr, &price, None, "paymentId already used")
            .await?;
        let after = self.chain_balances().await?;
        if after.1 != before.1 + 1000 {
            return Err(format!(
                "the payee got {} for one payment sent three times",
                after.1 - before.1
            ));
        }
        Ok(())
    }

    async fn settlement_failed(&self) -> Check {
        let price = Self::price(1000);
        let pid = self.pid(&price).await?;
        // A payer with no funds: every rule holds, the chain refuses (overspend).
        let broke = random_key();
        let s = self
            .build(&broke, &pid, 1000, |_| {})
            .await?
            .sign(&broke, None);
        self.expect_refused(
            &self.envelope(&s.encode()),
            &price,
            None,
            "settlement failed",
        )
        .await?;
        match self
            .receiver
            .settle(&self.envelope(&s.encode()), &price, None)
            .await
        {
            Err(e) if e.to_string().contains("overspend") => {}
            other => {
                return Err(format!(
                    "settlement failed must carry algod's message, got {other:?}"
                ));
            }
        }
        // The refusal released the paymentId: a funded payer can still pay it.
        let s = self
            .build(&self.payer_key, &pid, 1000, |_| {})
            .await?
            .sign(&self.payer_key, None);
        self.settle_ok(&self.envelope(&s.encode()), &price).await
    }

    async fn already_on_chain(&self) -> Check {
        let (price, _, s) = self.paid_by_payer(1000).await?;
        // Submitted behind the receiver's back (as by a settler that crashed before
        // recording anything): the receiver finds it on chain and serves it once.
        let before = self.chain_balances().await?;
        self.algod
            .submit(&s.encode())
            .await
            .map_err(|e| format!("direct submit: {e}"))?;
        let hdr = self.envelope(&s.encode());
        self.settle_ok(&hdr, &price).await?;
        self.expect_refused(&hdr, &price, None, "paymentId already used")
            .await?;
        let after = self.chain_balances().await?;
        if after.1 != before.1 + 1000 {
            return Err(format!("payee got {} instead of 1000", after.1 - before.1));
        }
        Ok(())
    }

    async fn rekeyed_account(&self) -> Check {
        // Rekey the spare account to a new key, for real, on chain.
        let new_key = random_key();
        let p = self.algod.params().await.map_err(|e| e.to_string())?;
        let rekey = PayTxn {
            sender: addr(&self.spare_key),
            receiver: addr(&self.spare_key),
            amount: 0,
            fee: 1000,
            first_valid: p.last_round.max(1),
            last_valid: p.last_round.max(1) + 1000,
            genesis_id: p.genesis_id,
            genesis_hash: p.genesis_hash,
            note: Vec::new(),
            close_to: None,
            rekey_to: Some(addr(&new_key)),
            group: None,
            lease: None,
        }
        .sign(&self.spare_key, None);
        let txid = self
            .algod
            .submit(&rekey.encode())
            .await
            .map_err(|e| format!("rekey: {e}"))?;
        self.algod
            .wait_for_confirmation(&txid, rekey.txn.last_valid)
            .await
            .map_err(|e| e.to_string())?;
        let price = Self::price(1000);
        // The old key no longer signs for the account.
        let pid = self.pid(&price).await?;
        let old = self
            .build(&self.spare_key, &pid, 1000, |_| {})
            .await?
            .sign(&self.spare_key, None);
        self.expect_refused(
            &self.envelope(&old.encode()),
            &price,
            None,
            "settlement failed",
        )
        .await?;
        // The new key, named in sgnr, does.
        let s = self
            .build(&self.spare_key, &pid, 1000, |_| {})
            .await?
            .sign(&new_key, Some(addr(&new_key)));
        self.settle_ok(&self.envelope(&s.encode()), &price).await
    }

    async fn envelopes(&self) -> Check {
        let (price, _, s) = self.paid_by_payer(1000).await?;
        let txn = BASE64.encode(&s.encode());
        let net = self.receiver.network().to_owned();
        let raw = |v: serde_json::Value| header(&v).unwrap_or_default();
        let cases = [
            ("not base64", "%%%".to_owned(), "malformed payment"),
            (
                "x402Version 1",
                raw(json!({"x402Version":1,"scheme":"exact","network":net,"payload":{"txn":txn}})),
                "malformed payment",
            ),
            (
                "scheme upto",
                raw(json!({"x402Version":2,"scheme":"upto","network":net,"payload":{"txn":txn}})),
                "malformed payment",
            ),
            (
                "testnet's network",
                raw(
                    json!({"x402Version":2,"scheme":"exact","network":"algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe","payload":{"txn":txn}}),
                ),
                "wrong network",
            ),
            (
                "unknown envelope field",
                raw(
                    json!({"x402Version":2,"scheme":"exact","network":net,"payload":{"txn":txn},"extra":1}),
                ),
                "malformed payment",
            ),
            (
                "txn not base64",
                raw(
                    json!({"x402Version":2,"scheme":"exact","network":net,"payload":{"txn":"***"}}),
                ),
                "malformed payment",
            ),
            (
                "amount as a JSON number in txn",
                raw(json!({"x402Version":2,"scheme":"exact","network":net,"payload":{"txn":1000}})),
                "malformed payment",
            ),
        ];
        for (name, hdr, code) in cases {
            self.expect_refused(&hdr, &price, None, code)
                .await
                .map_err(|e| format!("{name}: {e}"))?;
        }
        // After every malformed variant, the genuine payment still settles.
        self.settle_ok(&self.envelope(&s.encode()), &price).await
    }

    /// The receiver's network spelled as some x402 SDKs do (`algorand:` + the whole genesis
    /// hash in base64) is the same network: the payment settles; another chain's whole hash
    /// is refused.
    async fn whole_hash_network(&self) -> Check {
        let gh = self
            .algod
            .params()
            .await
            .map_err(|e| e.to_string())?
            .genesis_hash;
        let (price, _, s) = self.paid_by_payer(1000).await?;
        let txn = BASE64.encode(&s.encode());
        let raw = |network: &str| {
            header(
                &json!({"x402Version":2,"scheme":"exact","network":network,"payload":{"txn":txn}}),
            )
            .unwrap_or_default()
        };
        self.expect_refused(
            &raw("algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8="),
            &price,
            None,
            "wrong network",
        )
        .await
        .map_err(|e| format!("mainnet's whole hash: {e}"))?;
        let whole = format!("algorand:{}", BASE64.encode(&gh));
        self.settle_ok(&raw(&whole), &price).await
    }

    async fn encodings(&self) -> Check {
        let (price, _, s) = self.paid_by_payer(1000).await?;
        let bytes = s.encode();
        let Ok(Value::Map(outer)) = msgpack::decode(&bytes) else {
            return Err("own encoding does not decode".into());
        };
        let with = |k: &str, v: Value| {
            let mut o = outer.clone();
            o.insert(k.to_owned(), v);
            msgpack::encode(&Value::Map(o))
        };
        let mut non_canonical = bytes.clone();
        // A positive fixint re-encoded as uint8 (0xcc): same value, not canonical.
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("multisig", with("msig", Value::True), "multisig not accepted"),
            ("logicsig", with("lsig", Value::True), "logicsig not accepted"),
            ("unknown field", with("hgi", Value::True), "malformed payment"),
            ("trailing byte", {
                non_canonical.push(0);
                non_canonical.clone()
            }, "malformed payment"),
            ("asset transfer", {
                let mut o = outer.clone();
                if let Some(Value::Map(t)) = o.get_mut("txn") {
                    t.insert("type".into(), Value::Str("axfer".into()));
                }
                msgpack::encode(&Value::Map(o))
            }, "wrong transaction type"),
            ("golden SDK vector (another network)", BASE64
                .decode(b"gqNzaWfEQPhUAZ3xkDDcc8FvOVo6UinzmKBCqs0woYSfodlmBMfQvGbeUx3Srxy3dyJDzv7rLm26BRv9FnL2/AuT7NYfiAWjdHhui6NhbXTNA+ilY2xvc2XEIEDpNJKIJWTLzpxZpptnVCaJ6aHDoqnqW2Wm6KRCH/xXo2ZlZc0EmKJmds0wsqNnZW6sZGV2bmV0LXYzMy4womdoxCAmCyAJoJOohot5WHIvpeVG7eftF+TYXEx4r7BFJpDt0qJsds00mqRub3RlxAjqABVHQ2y/lqNyY3bEIHts4k/rW6zAsWTinCIsV/X2PcOH1DkEglhBHF/hD3wCo3NuZMQg5/D4TQaBHfnzHI2HixFV9GcdUaGFwgCQhmf0SVhwaKGkdHlwZaNwYXk=")
                .unwrap_or_default(), "wrong network"),
        ];
        for (name, b, code) in cases {
            self.expect_refused(&self.envelope(&b), &price, None, code)
                .await
                .map_err(|e| format!("{name}: {e}"))?;
        }
        self.settle_ok(&self.envelope(&bytes), &price).await
    }

    async fn overpaid(&self) -> Check {
        // `docs/exact-algo.md` §3.6 asks for amount >= maxAmountRequired: a tip is accepted,
        // and reported.
        let (price, _, s) = self.paid_by_payer(1500).await?;
        let r = self
            .receiver
            .settle(&self.envelope(&s.encode()), &price, None)
            .await
            .map_err(|e| e.to_string())?;
        if r.amount != "1500" {
            return Err(format!("receipt says {} for 1500 paid", r.amount));
        }
        Ok(())
    }
}
