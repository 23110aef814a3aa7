#!/usr/bin/env python3
"""A client written against the exact-algo seed's description only (seed §2, §5, §6).

It uses py-algorand-sdk (`algosdk`) to build and sign the payment, exactly as the seed's
minimal client does, and only the Python standard library (urllib) for HTTP: no knowledge of
the receiver's implementation, no x402 SDK.

    seed_client.py --url http://127.0.0.1:8402 --algod-url http://127.0.0.1:4001 \
        --algod-token devtoken --key <base64 32-byte Ed25519 seed> --mode http|mcp

http: GET /api/posts/1 -> 402; pay accepts[0]; retry with PAYMENT-SIGNATURE -> 200 and
      PAYMENT-RESPONSE; replay the same header -> 402 "paymentId already used".
mcp:  initialize; tools/call post_read -> isError + structuredContent.accepts; pay; retry with
      params._meta["x402/payment"] -> structuredContent.receipt; replay -> refused.

Prints one JSON summary on stdout; exits non-zero with a message on stderr on any deviation.
"""

import argparse
import base64
import json
import sys
import urllib.error
import urllib.request
import warnings

import nacl.signing
from algosdk import account, encoding, transaction
from algosdk.v2client import algod

# The seed's client calls txn.sign(sk), which algosdk 2.x marks deprecated (it still works);
# keep the call literal and the output clean.
warnings.filterwarnings("ignore", category=DeprecationWarning, module=__name__)

POST_ID = "1"
REPLAY_ERROR = "paymentId already used"


class Deviation(Exception):
    """The server did not behave as the seed describes."""


def expect(cond, what):
    if not cond:
        raise Deviation(what)


def request(url, method="GET", headers=None, body=None):
    """(status, headers as a lower-case dict, body bytes); HTTP errors are answers too."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def json_body(raw, what):
    try:
        return json.loads(raw)
    except ValueError as e:
        raise Deviation(f"{what}: body is not JSON ({e}): {raw[:200]!r}") from e


def private_key(seed_b64):
    """algosdk's private key (base64 of seed || public key) from a base64 32-byte seed."""
    seed = base64.b64decode(seed_b64, validate=True)
    expect(len(seed) == 32, f"--key must be 32 bytes of base64, got {len(seed)} bytes")
    sk = nacl.signing.SigningKey(seed)
    return base64.b64encode(bytes(sk) + bytes(sk.verify_key)).decode()


def pay(client, sk, me, a):
    """Seed §6, literally: the base64 PAYMENT-SIGNATURE value paying the requirement `a`."""
    sp = client.suggested_params()
    sp.flat_fee = True
    sp.fee = 1000
    txn = transaction.PaymentTxn(
        me, sp, a["payTo"], int(a["maxAmountRequired"]), note=a["extra"]["paymentId"].encode()
    )
    env = {
        "x402Version": 2,
        "scheme": "exact",
        "network": a["network"],
        "payload": {"txn": encoding.msgpack_encode(txn.sign(sk))},
    }
    return base64.b64encode(json.dumps(env).encode()).decode()


def check_requirement(pr, what):
    expect(pr.get("x402Version") == 2, f"{what}: x402Version is {pr.get('x402Version')!r}")
    accepts = pr.get("accepts")
    expect(isinstance(accepts, list) and accepts, f"{what}: no accepts[]: {pr}")
    a = accepts[0]
    for k in ("payTo", "maxAmountRequired", "network"):
        expect(isinstance(a.get(k), str) and a[k], f"{what}: accepts[0].{k} missing: {a}")
    expect(
        isinstance(a.get("extra"), dict) and isinstance(a["extra"].get("paymentId"), str),
        f"{what}: accepts[0].extra.paymentId missing: {a}",
    )
    expect(a.get("asset") == "ALGO", f"{what}: asset is {a.get('asset')!r}, not ALGO")
    return a


def http_mode(base, client, sk, me):
    url = f"{base}/api/posts/{POST_ID}"
    status, _, raw = request(url)
    expect(status == 402, f"unpaid GET {url}: expected 402, got {status}: {raw[:200]!r}")
    a = check_requirement(json_body(raw, "402"), "402 body")

    header = pay(client, sk, me, a)
    status, headers, raw = request(url, headers={"PAYMENT-SIGNATURE": header})
    expect(status == 200, f"paid GET {url}: expected 200, got {status}: {raw[:300]!r}")
    expect("payment-response" in headers, f"paid GET {url}: no PAYMENT-RESPONSE header")
    try:
        receipt = json.loads(base64.b64decode(headers["payment-response"], validate=True))
    except ValueError as e:
        raise Deviation(f"PAYMENT-RESPONSE is not base64 JSON: {e}") from e
    body = json_body(raw, "200")

    status, _, raw = request(url, headers={"PAYMENT-SIGNATURE": header})
    expect(status == 402, f"replayed GET {url}: expected 402, got {status}: {raw[:300]!r}")
    replay = json_body(raw, "replay 402")
    expect(
        replay.get("error") == REPLAY_ERROR,
        f"replay: expected error {REPLAY_ERROR!r}, got {replay.get('error')!r}",
    )
    return {
        "mode": "http",
        "status": 200,
        "receipt": receipt,
        "body": body,
        "replay": {"status": status, "error": replay["error"]},
        "payment": header,
    }


class Rpc:
    def __init__(self, url):
        self.url = url
        self.next_id = 0

    def call(self, method, params):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        status, _, raw = request(
            self.url,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
            body=json.dumps(msg).encode(),
        )
        expect(status == 200, f"MCP {method}: HTTP {status}: {raw[:300]!r}")
        answer = json_body(raw, f"MCP {method}")
        expect(answer.get("id") == self.next_id, f"MCP {method}: wrong id in {answer}")
        expect("error" not in answer, f"MCP {method}: JSON-RPC error {answer.get('error')}")
        expect(isinstance(answer.get("result"), dict), f"MCP {method}: no result: {answer}")
        return answer["result"]

    def notify(self, method):
        msg = {"jsonrpc": "2.0", "method": method}
        status, _, raw = request(
            self.url,
            method="POST",
            headers={"Content-Type": "application/json"},
            body=json.dumps(msg).encode(),
        )
        expect(status in (200, 202), f"MCP {method}: HTTP {status}: {raw[:300]!r}")


def mcp_mode(base, client, sk, me):
    rpc = Rpc(f"{base}/mcp")
    init = rpc.call(
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "seed_client.py", "version": "1"},
        },
    )
    expect("protocolVersion" in init, f"initialize: no protocolVersion: {init}")
    rpc.notify("notifications/initialized")

    call = {"name": "post_read", "arguments": {"post_id": POST_ID}}
    r = rpc.call("tools/call", call)
    expect(r.get("isError") is True, f"unpaid post_read: expected isError, got {r}")
    sc = r.get("structuredContent")
    expect(isinstance(sc, dict), f"unpaid post_read: no structuredContent: {r}")
    a = check_requirement(sc, "unpaid post_read")

    payment = pay(client, sk, me, a)
    paid = dict(call, _meta={"x402/payment": payment})
    r = rpc.call("tools/call", paid)
    sc = r.get("structuredContent")
    expect(
        r.get("isError") is not True and isinstance(sc, dict),
        f"paid post_read: expected a result, got {r}",
    )
    expect(isinstance(sc.get("receipt"), dict), f"paid post_read: no receipt: {sc}")
    expect(isinstance(sc.get("post"), dict), f"paid post_read: no post: {sc}")

    again = rpc.call("tools/call", paid)
    asc = again.get("structuredContent") or {}
    expect(again.get("isError") is True, f"replayed post_read: expected isError, got {again}")
    expect(
        asc.get("error") == REPLAY_ERROR,
        f"replay: expected error {REPLAY_ERROR!r}, got {asc.get('error')!r}",
    )
    return {
        "mode": "mcp",
        "receipt": sc["receipt"],
        "post": sc["post"],
        "replay": {"isError": True, "error": asc["error"]},
        "payment": payment,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--url", required=True, help="the receiver's base URL")
    p.add_argument("--algod-url", required=True)
    p.add_argument("--algod-token", default="")
    p.add_argument("--key", required=True, help="base64 of a 32-byte Ed25519 seed")
    p.add_argument("--mode", choices=("http", "mcp"), default="http")
    args = p.parse_args()

    base = args.url.rstrip("/")
    try:
        sk = private_key(args.key)
        me = account.address_from_private_key(sk)
        client = algod.AlgodClient(args.algod_token, args.algod_url)
        run = http_mode if args.mode == "http" else mcp_mode
        summary = run(base, client, sk, me)
    except Deviation as e:
        print(f"seed_client: deviation from the seed ({args.mode}): {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - any other failure is a deviation too
        print(f"seed_client: {args.mode} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    summary["payer"] = me
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
