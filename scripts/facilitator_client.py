#!/usr/bin/env python3
"""An independent client of the Stipendex facilitator, written from its documented protocol
(rail-account's `auth` and `api` modules) with PyPI's `cryptography` for Ed25519 and the
standard library for HTTP. Used by stipendex-facilitator/tests/python_client.rs.

  facilitator_client.py pay URL NETWORK PAYER_ID PAYER_SEED PAYEE_ID PAYEE_SEED CENTS
      the payee makes an offer, the payer pays it, the payee redeems it twice (the second is
      `replayed`), a request signed with another key is refused; prints a JSON summary.
  facilitator_client.py check ACCOUNT_PUBLIC_KEY NETWORK METHOD PATH ACCOUNT TIMESTAMP NONCE IDEM BODY_HEX SIGNATURE
      checks a request signed by the Rust client; prints `ok` or `bad`.
"""

import base64
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.exceptions import InvalidSignature

DOMAIN = "stipendex-facilitator/v1"


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def unb64url(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def canonical(network, method, path, account, ts, nonce, idem, body: bytes) -> bytes:
    return "\n".join([DOMAIN, network, method, path, account, str(ts), nonce, idem or "",
                      hashlib.sha256(body).hexdigest()]).encode()


def call(url, network, method, path, account, seed_hex, body=None, idem=None):
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(seed_hex))
    raw = json.dumps(body).encode() if body is not None else b""
    ts = int(time.time() * 1000)
    nonce = b64url(os.urandom(16))
    sig = key.sign(canonical(network, method, path, account, ts, nonce, idem, raw))
    headers = {
        "stipendex-account": account,
        "stipendex-timestamp": str(ts),
        "stipendex-nonce": nonce,
        "stipendex-signature": b64url(sig),
    }
    if idem:
        headers["idempotency-key"] = idem
    if raw:
        headers["content-type"] = "application/json"
    req = urllib.request.Request(url + path, data=raw or None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def pay(url, network, payer, payer_seed, payee, payee_seed, cents):
    out = {}
    # The payee's offer, as the account rail writes one (rail-core's Offer, decimal amounts).
    amount = f"{cents // 100}.{cents % 100:02d}"
    offer = {
        "rail": "account",
        "id": "q_" + os.urandom(16).hex(),
        "amount": {"amount": amount, "asset": {"code": "USD", "scale": 2}},
        "payee": payee,
        "mode": "capture",
        "expires_at": int(time.time() * 1000) + 60_000,
        "details": {"network": network},
    }
    op = "op_" + os.urandom(16).hex()
    status, paid = call(url, network, "POST", "/v1/payments", payer, payer_seed, {"offer": offer}, op)
    out["pay_status"] = status
    payment = paid["payment"]
    # The same key again: the same payment.
    status, again = call(url, network, "POST", "/v1/payments", payer, payer_seed, {"offer": offer}, op)
    out["pay_again_same"] = status == 201 and again["payment"] == payment
    pid = payment["proof"]["payment_id"]
    redeem = {"offer": offer, "payment": payment}
    status, verified = call(url, network, "POST", f"/v1/payments/{pid}/redeem", payee, payee_seed, redeem,
                            "redeem_" + os.urandom(8).hex())
    out["redeem_status"] = status
    out["verified_amount"] = verified.get("amount", {}).get("amount")
    status, replay = call(url, network, "POST", f"/v1/payments/{pid}/redeem", payee, payee_seed, redeem,
                          "redeem_" + os.urandom(8).hex())
    out["replay_status"] = status
    out["replay_code"] = replay["error"]["code"]
    status, forged = call(url, network, "GET", "/v1/account", payer, os.urandom(32).hex())
    out["forged_status"] = status
    out["forged_code"] = forged["error"]["code"]
    status, elsewhere = call(url, "another.facilitator", "GET", "/v1/account", payer, payer_seed)
    out["other_network_status"] = status
    status, view = call(url, network, "GET", "/v1/account", payer, payer_seed)
    out["payer_available"] = view["available"]["amount"]
    print(json.dumps(out))


def check(public, network, method, path, account, ts, nonce, idem, body_hex, signature):
    if not public.startswith("ed25519:"):
        print("bad")
        return
    key = Ed25519PublicKey.from_public_bytes(unb64url(public[len("ed25519:"):]))
    text = canonical(network, method, path, account, int(ts), nonce, idem if idem != "-" else "",
                     bytes.fromhex(body_hex))
    try:
        key.verify(unb64url(signature), text)
        print("ok")
    except InvalidSignature:
        print("bad")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "pay":
        pay(args[0], args[1], args[2], args[3], args[4], args[5], int(args[6]))
    elif mode == "check":
        check(*args)
    else:
        sys.exit(f"unknown mode {mode!r}")
