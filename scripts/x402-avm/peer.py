"""The x402-avm SDK (PyPI 2.0.2) as the independent peer of rail-exact-algo's AVM interop tests.

    /var/tmp/x402-avm-venv/bin/python scripts/x402-avm/peer.py client URL [N]
    /var/tmp/x402-avm-venv/bin/python scripts/x402-avm/peer.py facilitator
    /var/tmp/x402-avm-venv/bin/python scripts/x402-avm/peer.py server

- client: the SDK's client (x402Client + register_exact_avm_client + x402HttpxClient) pays URL
  once with the Ed25519 seed AVM_PAYER_SEED (hex); prints one JSON line
  {"status", "body", "paymentResponse"} (the decoded PAYMENT-RESPONSE, or null); with N, pays
  N times one after another and prints {"calls", "errors", "seconds", "p50", "p99"} (ms).
- facilitator: the SDK's facilitator (x402Facilitator + register_exact_avm_facilitator) behind
  /supported, /verify and /settle, written as algorandfoundation/x402's
  examples/python/facilitator/main.py writes them (the wheel ships no facilitator server and no
  signer), with the fee payer of AVM_FEE_PAYER_SEED (hex; unset: no fee payer).
- server: the SDK's FastAPI resource server (x402ResourceServer + PaymentMiddlewareASGI) with
  GET /paid priced PRICE ("$0.01", or "AMOUNT:ASSET") paid to PAY_TO on NETWORK (default
  testnet, whole-hash spelling), settled by the facilitator at FACILITATOR_URL.

The servers listen on 127.0.0.1 on a free port and print "listening on http://127.0.0.1:PORT".
ALGOD_TESTNET_URL must be set: unset, the SDK falls back to a public testnet node, which the
tests never use (the SDK reads it when x402.mechanisms.avm is first imported).
"""

import asyncio
import base64
import json
import os
import socket
import sys
import warnings

# algosdk 2.12 deprecates Transaction.sign, which the SDK's README and the example facilitator use.
warnings.filterwarnings("ignore", category=DeprecationWarning)

if not os.environ.get("ALGOD_TESTNET_URL"):
    sys.exit("peer.py: ALGOD_TESTNET_URL is not set; point it at the devnet (the SDK would use a public node)")

import algosdk  # noqa: E402
import algosdk.encoding  # noqa: E402
import algosdk.transaction  # noqa: E402
import algosdk.v2client.algod  # noqa: E402
import nacl.signing  # noqa: E402

ALGOD = os.environ["ALGOD_TESTNET_URL"]


def key_from_env(name):
    """A 64-byte algosdk secret key (seed || public key) and its address, from a hex seed."""
    value = os.environ.get(name, "")
    try:
        seed = bytes.fromhex(value)
    except ValueError:
        seed = b""
    if len(seed) != 32:
        sys.exit(f"peer.py: {name} is not a 32-byte hex Ed25519 seed")
    pk = bytes(nacl.signing.SigningKey(seed).verify_key)
    return seed + pk, algosdk.encoding.encode_address(pk)


class ClientSigner:
    """The SDK's ClientAvmSigner protocol (mechanisms/avm/signer.py), as its README writes one."""

    def __init__(self, sk, addr):
        self._sk = base64.b64encode(sk).decode()
        self._addr = addr

    @property
    def address(self):
        return self._addr

    def sign_transactions(self, unsigned_txns, indexes_to_sign):
        out = []
        for i, raw in enumerate(unsigned_txns):
            if i in indexes_to_sign:
                txn = algosdk.encoding.msgpack_decode(base64.b64encode(raw).decode())
                out.append(base64.b64decode(algosdk.encoding.msgpack_encode(txn.sign(self._sk))))
            else:
                out.append(None)
        return out


class FacilitatorSigner:
    """FacilitatorAvmSigner as algorandfoundation/x402's example facilitator implements it."""

    def __init__(self, sk, addr, client):
        self._sk = sk
        self._addr = addr
        self._algod = client

    def get_addresses(self):
        return [self._addr] if self._addr else []

    def _sign(self, raw):
        txn = algosdk.encoding.msgpack_decode(base64.b64encode(raw).decode())
        signed = txn.sign(base64.b64encode(self._sk).decode())
        return base64.b64decode(algosdk.encoding.msgpack_encode(signed))

    def sign_transaction(self, txn_bytes, fee_payer, network):
        if fee_payer != self._addr:
            raise ValueError(f"Unknown fee payer: {fee_payer}")
        return self._sign(txn_bytes)

    def sign_group(self, group_bytes, fee_payer, indexes_to_sign, network):
        if fee_payer != self._addr:
            raise ValueError(f"Unknown fee payer: {fee_payer}")
        result = list(group_bytes)
        for i in indexes_to_sign:
            result[i] = self._sign(group_bytes[i])
        return result

    def simulate_group(self, group_bytes, network):
        from algosdk.v2client.models import SimulateRequest, SimulateRequestTransactionGroup

        txns = []
        for raw in group_bytes:
            obj = algosdk.encoding.msgpack_decode(base64.b64encode(raw).decode())
            if isinstance(obj, algosdk.transaction.SignedTransaction):
                txns.append(obj)
            else:
                txns.append(algosdk.transaction.SignedTransaction(obj, None))
        request = SimulateRequest(
            txn_groups=[SimulateRequestTransactionGroup(txns=txns)],
            allow_unnamed_resources=True,
            allow_empty_signatures=True,
        )
        result = self._algod.simulate_transactions(request)
        if result.get("txn-groups") and result["txn-groups"][0].get("failure-message"):
            raise Exception(f"Simulation failed: {result['txn-groups'][0]['failure-message']}")

    def send_group(self, group_bytes, network):
        return self._algod.send_raw_transaction(base64.b64encode(b"".join(group_bytes)))

    def confirm_transaction(self, txid, network, rounds=4):
        algosdk.transaction.wait_for_confirmation(self._algod, txid, rounds)


def serve(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the line is printed: a client that connects at once waits in the backlog
    # until uvicorn accepts, instead of being refused.
    sock.listen(128)
    port = sock.getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


async def client(url, count=None):
    import time

    from x402 import x402Client
    from x402.http import decode_payment_response_header
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.avm.exact import register_exact_avm_client

    sk, addr = key_from_env("AVM_PAYER_SEED")
    x402 = register_exact_avm_client(x402Client(), ClientSigner(sk, addr), algod_url=ALGOD)
    async with x402HttpxClient(x402, timeout=30) as http:
        if count is None:
            r = await http.get(url)
            header = r.headers.get("payment-response")
            response = decode_payment_response_header(header).model_dump(by_alias=True) if header else None
            print(json.dumps({"status": r.status_code, "body": r.text, "paymentResponse": response}), flush=True)
            return
        # --bench: `count` paid calls one after another; latencies in ms.
        lat, errors, start = [], 0, time.perf_counter()
        for _ in range(count):
            t = time.perf_counter()
            r = await http.get(url)
            lat.append((time.perf_counter() - t) * 1000)
            errors += r.status_code != 200
        total = time.perf_counter() - start
        lat.sort()
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        print(json.dumps({"calls": count, "errors": errors, "seconds": total,
                          "p50": pick(0.5), "p99": pick(0.99)}), flush=True)


def facilitator():
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel

    from x402 import x402Facilitator
    from x402.mechanisms.avm import ALGORAND_TESTNET_CAIP2
    from x402.mechanisms.avm.exact import register_exact_avm_facilitator
    from x402.schemas import PaymentRequirements, parse_payment_payload

    if os.environ.get("AVM_FEE_PAYER_SEED"):
        sk, addr = key_from_env("AVM_FEE_PAYER_SEED")
    else:
        sk, addr = b"", ""
    signer = FacilitatorSigner(sk, addr, algosdk.v2client.algod.AlgodClient("", ALGOD))
    fac = register_exact_avm_facilitator(x402Facilitator(), signer, networks=ALGORAND_TESTNET_CAIP2)

    class Req(BaseModel):
        paymentPayload: dict
        paymentRequirements: dict

    app = FastAPI()

    @app.post("/verify")
    async def verify(r: Req):
        try:
            res = await fac.verify(
                parse_payment_payload(r.paymentPayload),
                PaymentRequirements.model_validate(r.paymentRequirements),
            )
        except Exception as e:  # as the example: a 500 naming the error
            raise HTTPException(status_code=500, detail=str(e))
        return res.model_dump(by_alias=True, exclude_none=True)

    @app.post("/settle")
    async def settle(r: Req):
        try:
            res = await fac.settle(
                parse_payment_payload(r.paymentPayload),
                PaymentRequirements.model_validate(r.paymentRequirements),
            )
        except Exception as e:
            raise HTTPException(status_code=500, detail=str(e))
        return res.model_dump(by_alias=True, exclude_none=True)

    @app.get("/supported")
    async def supported():
        return fac.get_supported().model_dump(by_alias=True, exclude_none=True)

    serve(app)


def server():
    from fastapi import FastAPI

    from x402.http import FacilitatorConfig, HTTPFacilitatorClient, PaymentOption
    from x402.http.middleware.fastapi import PaymentMiddlewareASGI
    from x402.http.types import RouteConfig
    from x402.mechanisms.avm import ALGORAND_TESTNET_CAIP2
    from x402.mechanisms.avm.exact import ExactAvmServerScheme
    from x402.schemas import AssetAmount
    from x402.server import x402ResourceServer

    network = os.environ.get("NETWORK", ALGORAND_TESTNET_CAIP2)
    price = os.environ.get("PRICE", "$0.01")
    if ":" in price:
        amount, asset = price.split(":", 1)
        price = AssetAmount(amount=amount, asset=asset, extra={"decimals": 6})
    rs = x402ResourceServer(HTTPFacilitatorClient(FacilitatorConfig(url=os.environ["FACILITATOR_URL"])))
    rs.register(network, ExactAvmServerScheme())
    app = FastAPI()

    @app.get("/paid")
    async def paid():
        return {"content": "paid by the x402-avm SDK's server"}

    app.add_middleware(
        PaymentMiddlewareASGI,
        server=rs,
        routes={
            "GET /paid": RouteConfig(
                accepts=[PaymentOption(scheme="exact", pay_to=os.environ["PAY_TO"], price=price, network=network)],
                description="a paid thing",
                mime_type="application/json",
            )
        },
    )
    serve(app)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "client" and len(sys.argv) == 3:
        asyncio.run(client(sys.argv[2]))
    elif cmd == "client" and len(sys.argv) == 4:
        asyncio.run(client(sys.argv[2], int(sys.argv[3])))
    elif cmd == "facilitator":
        facilitator()
    elif cmd == "server":
        server()
    else:
        sys.exit("usage: peer.py client URL | facilitator | server")
