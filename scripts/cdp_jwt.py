#!/usr/bin/env python3
"""CDP API-key JWTs checked by an independent implementation (PyPI PyJWT + cryptography).

rail-x402's `tests/cdp_auth.rs` runs this script as the authentication of a local x402
facilitator that, like Coinbase's hosted one, refuses every request without a valid token.

  cdp_jwt.py keygen ed25519|ec-sec1|ec-pkcs8
      A fresh CDP-style API key secret, as the CDP portal hands it out, and its public key:
      one JSON line {"secret": ..., "kty": "OKP"|"EC", "public": <hex>}. An Ed25519 secret is
      base64 of 64 bytes (seed, then public key); an EC secret is a P-256 PEM (SEC1
      "EC PRIVATE KEY" or PKCS#8 "PRIVATE KEY"). The public key is raw (Ed25519) or an
      uncompressed SEC1 point (P-256).

  cdp_jwt.py verify KEY_ID OKP|EC PUBLIC_HEX
      Reads one JSON request per line on stdin, {"authorization": <header or null>,
      "method": "POST", "host": "127.0.0.1:4021", "path": "/verify"}, and answers one JSON
      line each: {"ok": true} or {"ok": false, "error": <why>}. A token is accepted when PyJWT
      verifies its signature with the public key and its claims as Coinbase's SDKs make them
      (coinbase/cdp-sdk, generateJwt): header alg EdDSA (OKP) or ES256 (EC), kid = KEY_ID,
      typ JWT, a nonce; claims iss "cdp", sub = KEY_ID, aud "cdp_service", nbf/iat/exp
      present and valid, exp - iat <= 120, and uris = ["<METHOD> <host><path>"] naming this
      very request. A nonce seen before is refused: every request carries a fresh token.
"""

import base64
import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

AUDIENCE = "cdp_service"
MAX_LIFETIME = 120


def keygen(kind):
    if kind == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()
        seed = key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return {
            "secret": base64.b64encode(seed + public).decode(),
            "kty": "OKP",
            "public": public.hex(),
        }
    key = ec.generate_private_key(ec.SECP256R1())
    form = {
        "ec-sec1": serialization.PrivateFormat.TraditionalOpenSSL,
        "ec-pkcs8": serialization.PrivateFormat.PKCS8,
    }[kind]
    pem = key.private_bytes(
        serialization.Encoding.PEM, form, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    return {"secret": pem, "kty": "EC", "public": public.hex()}


def public_key(kty, public_hex):
    raw = bytes.fromhex(public_hex)
    if kty == "OKP":
        return ed25519.Ed25519PublicKey.from_public_bytes(raw), "EdDSA"
    if kty == "EC":
        return ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw), "ES256"
    raise SystemExit(f"unknown key type {kty!r}: use OKP or EC")


class Verifier:
    def __init__(self, key_id, kty, public_hex):
        self.key_id = key_id
        self.key, self.alg = public_key(kty, public_hex)
        self.nonces = set()

    def check(self, authorization, method, host, path):
        if not authorization:
            return "no Authorization header"
        scheme, _, token = authorization.partition(" ")
        if scheme != "Bearer" or not token:
            return "the Authorization header is not a bearer token"
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            return f"not a JWT: {e}"
        if header.get("alg") != self.alg:
            return f"alg {header.get('alg')!r}, expected {self.alg}"
        if header.get("kid") != self.key_id:
            return f"kid {header.get('kid')!r} is not the key id"
        if header.get("typ") != "JWT":
            return f"typ {header.get('typ')!r}, expected JWT"
        nonce = header.get("nonce")
        if not isinstance(nonce, str) or not nonce:
            return "no nonce in the header"
        try:
            claims = jwt.decode(
                token,
                self.key,
                algorithms=[self.alg],
                audience=AUDIENCE,
                issuer="cdp",
                options={"require": ["exp", "nbf", "iat", "sub", "iss", "aud", "uris"]},
            )
        except jwt.PyJWTError as e:
            return f"refused by PyJWT: {type(e).__name__}: {e}"
        if claims["sub"] != self.key_id:
            return f"sub {claims['sub']!r} is not the key id"
        if claims["exp"] - claims["iat"] > MAX_LIFETIME:
            return f"the token lives {claims['exp'] - claims['iat']} s, more than {MAX_LIFETIME}"
        expected = f"{method} {host}{path}"
        if claims["uris"] != [expected]:
            return f"uris {claims['uris']!r} does not name this request ({expected!r})"
        if nonce in self.nonces:
            return "a token presented before (its nonce is not fresh)"
        self.nonces.add(nonce)
        return None


def verify(key_id, kty, public_hex):
    verifier = Verifier(key_id, kty, public_hex)
    print(json.dumps({"ready": True, "pyjwt": jwt.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        error = verifier.check(
            req.get("authorization"), req["method"], req["host"], req["path"]
        )
        answer = {"ok": True} if error is None else {"ok": False, "error": error}
        print(json.dumps(answer), flush=True)


def main(argv):
    if len(argv) == 2 and argv[0] == "keygen":
        print(json.dumps(keygen(argv[1])))
    elif len(argv) == 4 and argv[0] == "verify":
        verify(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
