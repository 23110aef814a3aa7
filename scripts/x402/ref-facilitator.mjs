#!/usr/bin/env node
// Reference x402 v2 facilitator over HTTP, on the localnet.
//
// The x402 reference implementation ships no facilitator *server* package (DESIGN §8): the
// facilitator is the library class `x402Facilitator` (@x402/core/facilitator) with the EVM
// `exact` scheme registered by `registerExactEvmScheme` (@x402/evm/exact/facilitator). This file
// puts it behind a small express app, following the shape of the upstream example
// coinbase/x402 examples/typescript/facilitator/basic/index.ts (same routes, same signer wiring,
// same error mapping), so any x402 resource server — the reference one (ref-server.mjs) or
// our Rust rail — can use it.
//
// HTTP API (x402 v2 facilitator API):
//   POST /verify   body {x402Version, paymentPayload, paymentRequirements}
//                  -> 200 VerifyResponse {isValid, invalidReason?, invalidMessage?, payer?}
//   POST /settle   body {x402Version, paymentPayload, paymentRequirements}
//                  -> 200 SettleResponse {success, errorReason?, errorMessage?, payer?, transaction, network}
//   GET  /supported -> 200 {kinds:[{x402Version, scheme, network, extra?}], extensions:[], signers:{"eip155:*":[addr]}}
//   GET  /health    -> 200 {ok:true, address, network}   (ours, not part of x402)
// Error mapping (as in the upstream example):
//   - a payment that fails verification/settlement is NOT an HTTP error: 200 with isValid:false /
//     success:false and a machine reason (e.g. "invalid_exact_evm_payload_signature",
//     "invalid_exact_evm_payload_recipient_mismatch", see @x402/evm errors);
//   - a body without paymentPayload/paymentRequirements -> 400 {error};
//   - an exception inside the library (e.g. "No facilitator registered for scheme: X and network: Y",
//     RPC down) -> 500 {error}. @x402/core's HTTPFacilitatorClient turns a non-2xx whose JSON has
//     `isValid`/`success` into VerifyError/SettleError, and any other non-2xx into a plain Error.
//
// Environment:
//   X402_RPC_URL          localnet RPC (required)
//   X402_CHAIN_ID         chain id (default 31337); network is eip155:<id>
//   X402_FACILITATOR_KEY  settlement private key (required; an anvil dev key from localnet.mjs)
//   PORT                  listen port (default 0 = any free port); HOST (default 127.0.0.1)
//   X402_POLLING_MS       viem receipt polling interval in ms (default 50; viem's own default is 4000)
//   X402_NONCE_MANAGER=1  opt-in: viem's in-process nonce manager for the settlement account
//                         (the upstream example has none and loses nonce races under concurrency)
//   X402_LOG=1            log every verify/settle result to stderr
// Prints "Listening on http://127.0.0.1:<port>" on stdout once listening.

import express from "express";
import { x402Facilitator } from "@x402/core/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { registerExactEvmScheme } from "@x402/evm/exact/facilitator";
import { createWalletClient, defineChain, http, publicActions } from "viem";
import { nonceManager, privateKeyToAccount } from "viem/accounts";

const env = process.env;
function required(name) {
  const v = env[name];
  if (!v) {
    process.stderr.write(`ref-facilitator: ${name} is required\n`);
    process.exit(2);
  }
  return v;
}

const rpcUrl = required("X402_RPC_URL");
const chainId = Number(env.X402_CHAIN_ID ?? "31337");
const network = `eip155:${chainId}`;
const key = required("X402_FACILITATOR_KEY");
const pollingInterval = Number(env.X402_POLLING_MS ?? "50");
const verbose = env.X402_LOG === "1";

const chain = defineChain({
  id: chainId,
  name: "stipendex-anvil",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpcUrl] } },
});
const account = privateKeyToAccount(key, env.X402_NONCE_MANAGER === "1" ? { nonceManager } : undefined);

// One viem client with wallet + public actions, as in the upstream example. pollingInterval
// matters: waitForTransactionReceipt would otherwise poll every 4 s.
const viemClient = createWalletClient({
  account,
  chain,
  transport: http(rpcUrl),
  pollingInterval,
}).extend(publicActions);

// FacilitatorEvmSigner (see @x402/evm dist/esm/signer-*.d.mts): getAddresses is added by
// toFacilitatorEvmSigner, which also bounds every receipt wait (confirmationTimeoutMs, 180 s default).
const evmSigner = toFacilitatorEvmSigner({
  address: account.address,
  getCode: (args) => viemClient.getCode(args),
  readContract: (args) => viemClient.readContract({ ...args, args: args.args || [] }),
  verifyTypedData: (args) => viemClient.verifyTypedData(args),
  writeContract: (args) => viemClient.writeContract({ ...args, args: args.args || [] }),
  sendTransaction: (args) => viemClient.sendTransaction(args),
  waitForTransactionReceipt: (args) => viemClient.waitForTransactionReceipt({ ...args, pollingInterval }),
});

const facilitator = new x402Facilitator();
// Registers ExactEvmScheme (v2) for `network` and ExactEvmSchemeV1 for the built-in v1 network names.
registerExactEvmScheme(facilitator, { signer: evmSigner, networks: network });

const app = express();
app.use(express.json({ limit: "1mb" }));

function bodyParts(req) {
  const { paymentPayload, paymentRequirements } = req.body ?? {};
  if (!paymentPayload || typeof paymentPayload !== "object" || !paymentRequirements || typeof paymentRequirements !== "object") {
    return null;
  }
  return { paymentPayload, paymentRequirements };
}

const errMsg = (e) => (e instanceof Error ? e.message : String(e));

app.post("/verify", async (req, res) => {
  const parts = bodyParts(req);
  if (!parts) return res.status(400).json({ error: "Missing paymentPayload or paymentRequirements" });
  try {
    const result = await facilitator.verify(parts.paymentPayload, parts.paymentRequirements);
    if (verbose) process.stderr.write(`ref-facilitator: verify ${JSON.stringify(result)}\n`);
    res.json(result);
  } catch (e) {
    process.stderr.write(`ref-facilitator: verify error: ${errMsg(e)}\n`);
    res.status(500).json({ error: errMsg(e) });
  }
});

app.post("/settle", async (req, res) => {
  const parts = bodyParts(req);
  if (!parts) return res.status(400).json({ error: "Missing paymentPayload or paymentRequirements" });
  try {
    const result = await facilitator.settle(parts.paymentPayload, parts.paymentRequirements);
    if (verbose) process.stderr.write(`ref-facilitator: settle ${JSON.stringify(result)}\n`);
    res.json(result);
  } catch (e) {
    process.stderr.write(`ref-facilitator: settle error: ${errMsg(e)}\n`);
    // An onBeforeSettle hook abort throws "Settlement aborted: <reason>"; the upstream example
    // answers it as a failed SettleResponse. (No hooks are registered here, kept for parity.)
    if (errMsg(e).startsWith("Settlement aborted: ")) {
      return res.json({
        success: false,
        errorReason: errMsg(e).slice("Settlement aborted: ".length),
        transaction: "",
        network: parts.paymentRequirements.network ?? network,
      });
    }
    res.status(500).json({ error: errMsg(e) });
  }
});

app.get("/supported", (_req, res) => {
  try {
    res.json(facilitator.getSupported());
  } catch (e) {
    res.status(500).json({ error: errMsg(e) });
  }
});

app.get("/health", (_req, res) => res.json({ ok: true, address: account.address, network }));

const server = app.listen(Number(env.PORT ?? "0"), env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  process.stdout.write(`Listening on http://${address}:${port}\n`);
  process.stderr.write(`ref-facilitator: signer ${account.address} on ${network} via ${rpcUrl}\n`);
});
server.on("error", (e) => {
  process.stderr.write(`ref-facilitator: listen error: ${errMsg(e)}\n`);
  process.exit(1);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}
