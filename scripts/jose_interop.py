#!/usr/bin/env python3
"""Stipendex signed objects against an independent JOSE implementation: the PyPI package
`joserfc` (scripts/setup-localnets installs it in /var/tmp/algojig-venv), which shares no
code with the Rust `ed25519-dalek` / `stipendex::envelope::jws`.

Driven by stipendex/tests/jose_interop.rs:

    jose_interop.py verify <vectors dir>
        Every case of <dir>/{mandate,quote,confirmation,proof,receipt}.json whose `expect` is
        `valid` (and every object of chain.json's `valid` case) verifies with joserfc under the
        OKP Ed25519 key of its signer, taken from the file's `keys` (`ed25519:` + base64url of
        the 32 raw bytes), and its payload carries the tag `<object>/0.<minor>`; every
        `bad_signature` case fails to verify. The cases malformed at the JWS level (JWS_SHAPES,
        unlike the Stipendex rules on the kid and the payload) are tried too, and those joserfc
        accepts are listed (joserfc 1.6.5 reads a padded standard-base64 signature; 1.8.0
        refuses every one). Prints one JSON summary line.

    jose_interop.py sign <vectors dir>
        Signs a Quote-shaped payload (the receiver of quote.json's keys, EdDSA, header
        {alg, kid: "ed25519:<base64url>", typ: "stipendex+jws"}) with joserfc and prints the
        compact JWS, which the Rust side parses as a Signed<Quote>.

Any failure exits non-zero with the reason on stderr.
"""

import base64
import json
import sys
import warnings
from pathlib import Path

import joserfc
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import OKPKey

OBJECTS = ["mandate", "quote", "confirmation", "proof", "receipt"]
# The signer of each object type, as named in the files' `keys`.
CHAIN_SIGNERS = {
    "mandate": "principal",
    "confirmation": "wallet",
    "quote": "receiver",
    "proof": "wallet",
    "receipt": "receiver",
}
ALGORITHMS = ["EdDSA"]
# The malformed cases of every object file that break the JWS itself (RFC 7515 / RFC 8037), not
# a rule of the Stipendex profile on the header's kid or on the payload.
JWS_SHAPES = [
    "signed_payload_not_base64url",
    "alg_none",
    "alg_hs256",
    "header_with_crit",
    "header_not_json",
    "extra_part",
    "two_parts",
    "empty",
    "header_padded",
    "signature_standard_base64",
    "signature_noncanonical_bits",
    "signature_truncated",
    "jws_json_serialization",
]

# joserfc marks "EdDSA" as deprecated by RFC 9864 (in favour of "Ed25519"); Stipendex uses the
# RFC 8037 name, which every JOSE library reads. The warning is not a failure.
warnings.filterwarnings("ignore", message=".*EdDSA.*")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def public_jwk(key_text: str) -> OKPKey:
    """The OKP Ed25519 key of a Stipendex key text `ed25519:<base64url of 32 bytes>`."""
    prefix = "ed25519:"
    if not key_text.startswith(prefix):
        raise ValueError(f"not a Stipendex key: {key_text!r}")
    raw = b64url_decode(key_text[len(prefix):])
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    return OKPKey.import_key({"kty": "OKP", "crv": "Ed25519", "x": b64url(raw)})


def private_jwk(key: dict) -> OKPKey:
    """The OKP Ed25519 private key of a vector file's key entry (seed in hex, public text)."""
    seed = bytes.fromhex(key["seed"])
    public = b64url_decode(key["public"][len("ed25519:"):])
    return OKPKey.import_key(
        {"kty": "OKP", "crv": "Ed25519", "x": b64url(public), "d": b64url(seed)}
    )


def verify_one(compact: str, key_text: str, kind: str, where: str) -> None:
    obj = jws.deserialize_compact(compact, public_jwk(key_text), algorithms=ALGORITHMS)
    if obj.protected.get("alg") != "EdDSA":
        raise AssertionError(f"{where}: alg is {obj.protected.get('alg')!r}")
    if obj.protected.get("kid") != key_text:
        raise AssertionError(f"{where}: kid {obj.protected.get('kid')!r} is not {key_text}")
    payload = json.loads(obj.payload)
    tag = payload.get("stipendex")
    name, _, version = str(tag).partition("/")
    major, _, minor = version.partition(".")
    if name != kind or major != "0" or not minor.isdigit():
        raise AssertionError(f"{where}: the payload's tag is {tag!r}, not {kind}/0.<minor>")


def refuses(compact: str, key_text: str) -> bool:
    try:
        jws.deserialize_compact(compact, public_jwk(key_text), algorithms=ALGORITHMS)
    except (JoseError, ValueError):
        return True
    return False


def verify(directory: Path) -> dict:
    valid = refused = shapes = 0
    accepted_shapes = []
    for kind in OBJECTS:
        data = json.loads((directory / f"{kind}.json").read_text(encoding="utf-8"))
        if data["object"] != kind:
            raise AssertionError(f"{kind}.json holds {data['object']} objects")
        keys = data["keys"]
        # The key the object declares: the valid case's signer.
        declared = keys[next(c for c in data["cases"] if c["name"] == "valid")["signer"]]
        names = {c["name"] for c in data["cases"]}
        if not set(JWS_SHAPES) <= names:
            raise AssertionError(f"{kind}.json lacks the cases {sorted(set(JWS_SHAPES) - names)}")
        for case in data["cases"]:
            where = f"{kind}.json/{case['name']}"
            if case["expect"] == "valid":
                verify_one(case["jws"], keys[case["signer"]]["public"], kind, where)
                valid += 1
            elif case["expect"] == "bad_signature":
                if not refuses(case["jws"], declared["public"]):
                    raise AssertionError(f"{where}: joserfc accepts a tampered JWS")
                refused += 1
            elif case["name"] in JWS_SHAPES:
                if case["expect"] != "malformed":
                    raise AssertionError(f"{where}: expected {case['expect']}, not malformed")
                if refuses(case["jws"], declared["public"]):
                    shapes += 1
                else:
                    accepted_shapes.append(where)
    chain = json.loads((directory / "chain.json").read_text(encoding="utf-8"))
    valid_chain = next(c for c in chain["cases"] if c["name"] == "valid")
    for i, compact in enumerate(valid_chain["objects"]):
        payload = json.loads(b64url_decode(compact.split(".")[1]))
        kind = str(payload.get("stipendex")).split("/")[0]
        signer = CHAIN_SIGNERS[kind]
        verify_one(compact, chain["keys"][signer]["public"], kind, f"chain.json/valid[{i}]")
        valid += 1
    return {
        "joserfc": joserfc.__version__,
        "verified": valid,
        "refused_tampered": refused,
        "refused_shapes": shapes,
        "accepted_shapes": accepted_shapes,
    }


def sign(directory: Path) -> str:
    data = json.loads((directory / "quote.json").read_text(encoding="utf-8"))
    receiver = data["keys"]["receiver"]
    now = data["now"]
    payload = {
        # Member order and spacing differ from what Stipendex writes on purpose: the parser
        # must not depend on them.
        "rails": [
            {
                "offer": {
                    "rail": "ledger",
                    "id": "o_joserfc-1",
                    "amount": {"asset": {"scale": 2, "code": "USD"}, "amount": "1.25"},
                    "payee": "acct-shop",
                    "mode": "capture",
                    "expires_at": (now + 60) * 1000,
                    "details": {"note": "signed by joserfc"},
                },
                "rail": "ledger",
            }
        ],
        "stipendex": "quote/0.1",
        "id": "q_joserfc-1",
        "receiver": {"id": "search", "key": receiver["public"]},
        "iat": now,
        "exp": now + 60,
        "profile": "service",
        "asset": {"code": "USD", "scale": 2},
        "amount": "1.25",
        "capability": {"method": "GET", "name": "/report"},
        "description": "caf\u00e9 \u2615 \u201cquoted\u201d \\ / \u0000 end",
    }
    protected = {"alg": "EdDSA", "kid": receiver["public"], "typ": "stipendex+jws"}
    body = json.dumps(payload, ensure_ascii=False, indent=1).encode("utf-8")
    return jws.serialize_compact(protected, body, private_jwk(receiver), algorithms=ALGORITHMS)


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("verify", "sign"):
        sys.stderr.write("usage: jose_interop.py verify|sign <vectors dir>\n")
        return 2
    directory = Path(sys.argv[2])
    try:
        if sys.argv[1] == "verify":
            print(json.dumps(verify(directory)), flush=True)
        else:
            print(sign(directory), flush=True)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, with its reason
        sys.stderr.write(f"jose_interop.py {sys.argv[1]}: {type(exc).__name__}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
