#!/usr/bin/env python3
"""Independent BOLT11 decoder for the Lightning interop test (rail-ln-nwc/tests/interop.rs).

It uses only the PyPI package `bolt11` (scripts/setup-localnets installs it in
/var/tmp/algojig-venv), which shares no code with the Rust `lightning-invoice` crate.

    bolt11_decode.py < invoices.txt

Reads one BOLT11 invoice per line on stdin and prints, for every input line, one JSON object
on its own line, in order:

    {"ok": true, "amount_msat": int | null, "payment_hash": hex, "payee": hex (33-byte
     compressed node key: the `n` field, or recovered from the signature), "description":
     str | null, "description_hash": hex | null, "expiry": seconds, "currency": "bc" | "tb" |
     "tbs" | "bcrt", "date": unix seconds, "min_final_cltv_expiry": int,
     "payment_secret": hex | null}
    {"ok": false, "error": "..."}

`bolt11.decode` verifies the signature against the `n` field when there is one and otherwise
recovers the payee from it, checks the bech32 checksum, and requires a payment hash, a payment
secret and exactly one of description / description hash.
"""

import json
import sys

import bolt11


def describe(line: str) -> dict:
    invoice = line.strip()
    if not invoice:
        return {"ok": False, "error": "empty line"}
    try:
        decoded = bolt11.decode(invoice)
        amount = decoded.amount_msat
        return {
            "ok": True,
            "amount_msat": None if amount is None else int(amount),
            "payment_hash": decoded.payment_hash,
            "payee": decoded.payee,
            "description": decoded.description,
            "description_hash": decoded.description_hash,
            "expiry": int(decoded.expiry),
            "currency": decoded.currency,
            "date": int(decoded.date),
            "min_final_cltv_expiry": int(decoded.min_final_cltv_expiry),
            "payment_secret": decoded.payment_secret,
        }
    except Exception as exc:  # noqa: BLE001 - every failure is an answer, not a crash
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    for line in sys.stdin:
        print(json.dumps(describe(line)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
