#!/usr/bin/env node
// Reference x402 v2 resource server (express + @x402/express paymentMiddleware) on the localnet.
//
// Routes:
//   GET /weather  paid: `exact` on eip155:<chainId>, X402_PRICE atomic units (default "1000" =
//                 0.001 USDC) of X402_TOKEN, payTo X402_PAY_TO, EIP-712 domain extra
//                 {name: "USD Coin", version: "2"}; answers {"report":{"weather":"sunny","temperature":70}}
//   GET /health   free
//
// Wiring (see @x402/express dist/esm/index.d.mts and @x402/core/server):
//   new x402ResourceServer(new HTTPFacilitatorClient({url}))   the facilitator is remote (HTTP)
//   registerExactEvmScheme(server, {networks:[network]})        @x402/evm/exact/server
//   app.use(paymentMiddleware(routes, server))                  v2 middleware
// The price is given as an AssetAmount {amount, asset, extra:{name, version}}: a "$0.001" Money
// price would be resolved by the scheme's default-asset table, which has no entry for a local
// chain (DESIGN §8). paymentMiddleware fetches GET /supported from the facilitator at start
// (syncFacilitatorOnStart=true) and refuses a route whose scheme/network the facilitator does not
// support, so the facilitator must be up before the first paid request.
//
// Environment:
//   X402_FACILITATOR_URL  reference (or any x402 v2) facilitator base URL (required)
//   X402_TOKEN            token address (required)
//   X402_PAY_TO           receiver address (required)
//   X402_CHAIN_ID         default 31337
//   X402_PRICE            atomic amount, default "1000"
//   X402_TOKEN_NAME       EIP-712 domain name, default "USD Coin"
//   X402_TOKEN_VERSION    EIP-712 domain version, default "2"
//   X402_MAX_TIMEOUT_SECONDS  default 60
//   PORT (default 0 = any free port), HOST (default 127.0.0.1)
// Prints "Listening on http://127.0.0.1:<port>" on stdout once listening.

import express from "express";
import { paymentMiddleware } from "@x402/express";
import { HTTPFacilitatorClient, x402ResourceServer } from "@x402/core/server";
import { registerExactEvmScheme } from "@x402/evm/exact/server";
import { getAddress } from "viem";

const env = process.env;
function required(name) {
  const v = env[name];
  if (!v) {
    process.stderr.write(`ref-server: ${name} is required\n`);
    process.exit(2);
  }
  return v;
}

const facilitatorUrl = required("X402_FACILITATOR_URL");
const token = getAddress(required("X402_TOKEN"));
const payTo = getAddress(required("X402_PAY_TO"));
const chainId = Number(env.X402_CHAIN_ID ?? "31337");
const network = `eip155:${chainId}`;
const price = env.X402_PRICE ?? "1000";
if (!/^\d+$/.test(price)) {
  process.stderr.write("ref-server: X402_PRICE must be an integer atomic amount\n");
  process.exit(2);
}

const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: facilitatorUrl }));
registerExactEvmScheme(resourceServer, { networks: [network] });

const routes = {
  "GET /weather": {
    accepts: {
      scheme: "exact",
      network,
      payTo,
      price: {
        amount: price,
        asset: token,
        extra: { name: env.X402_TOKEN_NAME ?? "USD Coin", version: env.X402_TOKEN_VERSION ?? "2" },
      },
      maxTimeoutSeconds: Number(env.X402_MAX_TIMEOUT_SECONDS ?? "60"),
    },
    description: "Weather report (Stipendex reference test route)",
    mimeType: "application/json",
  },
};

const app = express();
app.get("/health", (_req, res) => res.json({ ok: true }));
app.use(paymentMiddleware(routes, resourceServer));
app.get("/weather", (_req, res) => {
  res.json({ report: { weather: "sunny", temperature: 70 } });
});

const server = app.listen(Number(env.PORT ?? "0"), env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  process.stdout.write(`Listening on http://${address}:${port}\n`);
  process.stderr.write(`ref-server: GET /weather costs ${price} of ${token} on ${network}, payTo ${payTo}, facilitator ${facilitatorUrl}\n`);
});
server.on("error", (e) => {
  process.stderr.write(`ref-server: listen error: ${e?.message ?? e}\n`);
  process.exit(1);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}
