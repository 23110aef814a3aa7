#!/usr/bin/env node
// Reference x402 v2 client: fetches <url>, pays a 402 with the `exact` EVM scheme (EIP-3009
// transferWithAuthorization signature), and prints ONE JSON line on stdout:
//   {"status":200,"body":...,"paymentResponse":{success,transaction,network,payer,...}|null,
//    "paymentRequired":{x402Version,resource,accepts,...}|null,"elapsedMs":N}
// Exit code 0 if the final status is 2xx, 1 otherwise (also on an exception, with "error").
//
// Usage: X402_PAYER_KEY=0x... [X402_TOKEN=0x...] [X402_CHAIN_ID=31337] node ref-pay.mjs <url>
//
// Wiring (see @x402/fetch dist/esm/index.d.mts, @x402/evm dist/esm/exact/client/index.d.mts,
// @x402/core client x402Client):
//   const client = new x402Client();
//   registerExactEvmScheme(client, { signer: privateKeyToAccount(key), networks: [network] });
//   client.setSpendControls({ allowedAssets: [{ network, asset: token }] });
//   const pay = wrapFetchWithPayment(fetch, client);
// Spend controls (2.27.0): by default the client only pays assets its default-asset table knows
// (real USDC etc.), capped at "$1" per payment; any other token is refused with "All payment
// requirements were rejected by spendControls ...". A local token must be allow-listed with
// allowedAssets:[{network, asset, maxAmountPerPayment?}] (atomic cap, omit = uncapped),
// allowedAssets:true (any asset), or spendControls:false (no controls at all).
//
// Environment:
//   X402_PAYER_KEY       payer private key (required; an anvil dev key from localnet.mjs)
//   X402_CHAIN_ID        default 31337 (network eip155:<id>)
//   X402_TOKEN           token to allow-list; if unset, every asset is allowed (allowedAssets:true)
//   X402_MAX_AMOUNT      optional atomic per-payment cap for X402_TOKEN
//   X402_METHOD          HTTP method, default GET
//
// wrapFetchWithPayment hides the first 402 from its caller, so the underlying fetch is wrapped
// here to capture that response's PAYMENT-REQUIRED header.

import { wrapFetchWithPayment, x402Client, decodePaymentResponseHeader } from "@x402/fetch";
import { decodePaymentRequiredHeader } from "@x402/core/http";
import { registerExactEvmScheme } from "@x402/evm/exact/client";
import { privateKeyToAccount } from "viem/accounts";

const env = process.env;
const url = process.argv[2];
const t0 = performance.now();

function finish(obj, ok) {
  process.stdout.write(JSON.stringify({ ...obj, elapsedMs: Math.round(performance.now() - t0) }) + "\n");
  process.exit(ok ? 0 : 1);
}

async function main() {
  if (!url) throw new Error("usage: node ref-pay.mjs <url>");
  if (!env.X402_PAYER_KEY) throw new Error("X402_PAYER_KEY is required");
  const network = `eip155:${Number(env.X402_CHAIN_ID ?? "31337")}`;
  const account = privateKeyToAccount(env.X402_PAYER_KEY);

  const client = new x402Client();
  registerExactEvmScheme(client, { signer: account, networks: [network] });
  if (env.X402_TOKEN) {
    const entry = { network, asset: env.X402_TOKEN };
    if (env.X402_MAX_AMOUNT) entry.maxAmountPerPayment = env.X402_MAX_AMOUNT;
    client.setSpendControls({ allowedAssets: [entry] });
  } else {
    process.stderr.write("ref-pay: X402_TOKEN unset: allowing any asset (allowedAssets: true)\n");
    client.setSpendControls({ allowedAssets: true });
  }

  let paymentRequired = null;
  const observingFetch = async (input, init) => {
    const res = await fetch(input, init);
    if (res.status === 402 && paymentRequired === null) {
      const h = res.headers.get("PAYMENT-REQUIRED");
      if (h) {
        try { paymentRequired = decodePaymentRequiredHeader(h); } catch { /* leave null */ }
      }
    }
    return res;
  };

  const pay = wrapFetchWithPayment(observingFetch, client);
  const res = await pay(url, { method: env.X402_METHOD ?? "GET" });
  const text = await res.text();
  let body;
  try { body = text ? JSON.parse(text) : null; } catch { body = text; }
  const pr = res.headers.get("PAYMENT-RESPONSE") ?? res.headers.get("X-PAYMENT-RESPONSE");
  let paymentResponse = null;
  if (pr) {
    try { paymentResponse = decodePaymentResponseHeader(pr); } catch { paymentResponse = { undecodable: pr }; }
  }
  finish({ status: res.status, body, paymentResponse, paymentRequired }, res.status >= 200 && res.status < 300);
}

main().catch((e) => {
  finish({ status: null, body: null, paymentResponse: null, paymentRequired: null, error: e instanceof Error ? e.message : String(e) }, false);
});
