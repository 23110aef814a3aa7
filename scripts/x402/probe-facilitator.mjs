#!/usr/bin/env node
// Probes an x402 v2 facilitator's HTTP API (POST /verify, POST /settle, GET /supported) with real
// payments signed by the reference client scheme, and records how it answers good and bad input.
// Used by selftest.sh against ref-facilitator.mjs; also usable against any facilitator (e.g. the
// Rust one) to compare answers case by case.
//
// Usage: node probe-facilitator.mjs <facilitatorUrl>
// Environment: X402_PAYER_KEY, X402_TOKEN, X402_PAY_TO, X402_CHAIN_ID (default 31337),
//              X402_PRICE (default 1000), X402_TOKEN_NAME ("USD Coin"), X402_TOKEN_VERSION ("2").
// Output: one JSON line per case on stdout: {case, http, body, pass}; the last line is
// "probe: N passed, N failed". Exit 0 iff every case matched its expectation.
//
// Expectations encode what the reference facilitator (x402Facilitator + ExactEvmScheme, 2.27.0)
// does: invalid payments are HTTP 200 with isValid:false / success:false and a reason string from
// @x402/evm's error constants; malformed bodies are 400; library exceptions (e.g. no scheme for
// the network) are 500 {error}.

import { x402Client } from "@x402/core/client";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";
import { getAddress } from "viem";

const env = process.env;
const base = (process.argv[2] ?? "").replace(/\/+$/, "");
if (!base) {
  process.stderr.write("usage: node probe-facilitator.mjs <facilitatorUrl>\n");
  process.exit(2);
}
const network = `eip155:${Number(env.X402_CHAIN_ID ?? "31337")}`;
const requirements = {
  scheme: "exact",
  network,
  amount: env.X402_PRICE ?? "1000",
  asset: getAddress(env.X402_TOKEN),
  payTo: getAddress(env.X402_PAY_TO),
  maxTimeoutSeconds: 60,
  extra: { name: env.X402_TOKEN_NAME ?? "USD Coin", version: env.X402_TOKEN_VERSION ?? "2" },
};
const paymentRequired = {
  x402Version: 2,
  resource: { url: "http://127.0.0.1/probe", description: "probe", mimeType: "application/json" },
  accepts: [requirements],
};

const client = new x402Client();
registerExactEvmScheme(client, { signer: privateKeyToAccount(env.X402_PAYER_KEY), networks: [network] });
client.setSpendControls({ allowedAssets: [{ network, asset: requirements.asset }] });
/** A fresh signed PaymentPayload {x402Version, resource, accepted, payload:{signature, authorization}}. */
const sign = () => client.createPaymentPayload(paymentRequired);

async function call(method, path, body) {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json;
  try { json = JSON.parse(text); } catch { json = text; }
  return { http: res.status, body: json };
}
const req = (paymentPayload, paymentRequirements = requirements) =>
  ({ x402Version: 2, paymentPayload, paymentRequirements });

let passed = 0;
let failed = 0;
function record(name, r, pass) {
  pass ? passed++ : failed++;
  process.stdout.write(JSON.stringify({ case: name, http: r.http, body: r.body, pass }) + "\n");
}
const flip = (hex) => hex.slice(0, -3) + (hex.at(-3) === "0" ? "1" : "0") + hex.slice(-2); // changes s

const good = await sign();

let r = await call("GET", "/supported");
record("supported", r, r.http === 200 && r.body.kinds?.some((k) => k.x402Version === 2 && k.scheme === "exact" && k.network === network));

r = await call("POST", "/verify", req(good));
record("verify valid", r, r.http === 200 && r.body.isValid === true);

const tampered = structuredClone(good);
tampered.payload.signature = flip(tampered.payload.signature);
r = await call("POST", "/verify", req(tampered));
record("verify tampered signature", r, r.http === 200 && r.body.isValid === false);

r = await call("POST", "/verify", req(good, { ...requirements, payTo: getAddress("0x000000000000000000000000000000000000dEaD") }));
record("verify wrong payTo", r, r.http === 200 && r.body.isValid === false);

r = await call("POST", "/verify", req(good, { ...requirements, amount: String(BigInt(requirements.amount) + 1n) }));
record("verify amount mismatch", r, r.http === 200 && r.body.isValid === false);

r = await call("POST", "/verify", req(good, { ...requirements, extra: { ...requirements.extra, version: "1" } }));
record("verify wrong EIP-712 version", r, r.http === 200 && r.body.isValid === false);

r = await call("POST", "/verify", req({ ...good, accepted: { ...good.accepted, network: "eip155:1" } }, { ...requirements, network: "eip155:1" }));
record("verify unsupported network", r, r.http === 500 || (r.http === 200 && r.body.isValid === false));

r = await call("POST", "/verify", { x402Version: 2 });
record("verify missing fields", r, r.http === 400);

r = await call("POST", "/settle", req(good));
record("settle valid", r, r.http === 200 && r.body.success === true && /^0x[0-9a-f]{64}$/.test(r.body.transaction));

r = await call("POST", "/settle", req(good));
record("settle replay", r, r.http === 200 && r.body.success === false);

r = await call("POST", "/verify", req(good));
record("verify after settle (nonce used)", r, r.http === 200 && r.body.isValid === false);

process.stdout.write(`probe: ${passed} passed, ${failed} failed\n`);
process.exit(failed === 0 ? 0 : 1);
