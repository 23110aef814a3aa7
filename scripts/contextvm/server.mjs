#!/usr/bin/env node
// A ContextVM server on the TypeScript SDK (npm @contextvm/sdk 0.11.14, pinned in package-lock.json):
// an MCP McpServer (@modelcontextprotocol/sdk/server/mcp.js) behind the SDK's NostrServerTransport,
// gated by CEP-8 payments (withServerPayments + LnBolt11NwcPaymentProcessor). See README.md.
//
//   node server.mjs [--relay URL]... [--nwc URI] [--price SATS]
//
// Env (argv wins): CVM_RELAYS (comma-separated relay URLs), CVM_NWC (the shop wallet's
// nostr+walletconnect:// URI; without it nothing is priced), CVM_PRICE_SATS (default 10),
// CVM_SERVER_KEY (hex secret key; default a fresh one), CVM_NWC_NOTIFICATIONS (1: verify by NWC
// payment_received notifications only, 0: poll lookup_invoice only, unset: the SDK auto-detects from
// the wallet's kind 13194 info event), CVM_ENCRYPTION (optional|required|disabled) and
// CVM_GIFT_WRAP (optional|ephemeral|persistent) (the SDK defaults: optional, optional),
// CVM_TIMEOUT_MS (default 30000: how long to wait for the relays before giving up, exit 1),
// LOG_LEVEL (the SDK's pino level; default error here; logs go to stderr).
//
// Tools: echo {q} -> "echo: <q>" (free); search {q} -> "search: <q>" (priced, tools/call search).
// When the transport is started and its subscription is live on the relays, prints one line
// {"pubkey":"<server pubkey hex>"} on stdout; then serves until SIGTERM, SIGINT or stdin closes.
//
// Follows (in node_modules/@contextvm/sdk/dist/esm/): transport/nostr-server-transport.{d.ts,js},
// transport/base-nostr-transport.d.ts, payments/server-transport-payments.d.ts,
// payments/server-payments.d.ts, payments/types.d.ts (PricedCapability),
// payments/processors/ln-bolt11-nwc-payment-processor.d.ts, core/utils/logger.js (LOG_LEVEL is read
// once, when the SDK module loads: hence the dynamic imports below).
process.env.LOG_LEVEL ??= 'error';
if (process.env.LOG_DESTINATION === 'stdout') delete process.env.LOG_DESTINATION; // stdout is ours

const { McpServer } = await import('@modelcontextprotocol/sdk/server/mcp.js');
const { z } = await import('zod');
const { NostrServerTransport, PrivateKeySigner, withServerPayments, LnBolt11NwcPaymentProcessor } =
  await import('@contextvm/sdk');

const log = (...parts) => console.error('server.mjs:', ...parts);
function usage(msg) {
  log(msg);
  log('usage: server.mjs [--relay URL]... [--nwc URI] [--price SATS]');
  process.exit(2);
}

const opts = {
  relays: (process.env.CVM_RELAYS ?? '').split(',').filter(Boolean),
  nwc: process.env.CVM_NWC || null,
  price: Number(process.env.CVM_PRICE_SATS ?? 10),
};
for (let i = 2, fromArgv = false; i < process.argv.length; i += 2) {
  const [a, v] = [process.argv[i], process.argv[i + 1]];
  if (v === undefined) usage(`${a} needs a value`);
  if (a === '--relay') {
    if (!fromArgv) opts.relays = [];
    fromArgv = true;
    opts.relays.push(v);
  } else if (a === '--nwc') opts.nwc = v;
  else if (a === '--price') opts.price = Number(v);
  else usage(`unknown argument '${a}'`);
}
if (opts.relays.length === 0) usage('no relay: give --relay URL or CVM_RELAYS');
if (!(Number.isInteger(opts.price) && opts.price > 0)) usage('the price must be a positive integer (sats)');

const mcp = new McpServer({ name: 'stipendex-contextvm-selftest', version: '0.0.0' });
const text = (s) => ({ content: [{ type: 'text', text: s }] });
mcp.registerTool('echo', { description: 'Echo q back (free)', inputSchema: { q: z.string() } }, ({ q }) =>
  text(`echo: ${q}`),
);
mcp.registerTool('search', { description: 'A paid search', inputSchema: { q: z.string() } }, ({ q }) =>
  text(`search: ${q}`),
);

let signer, transport;
try { // the constructors validate their input (secret key, NWC URI): a usage error
  signer = new PrivateKeySigner(process.env.CVM_SERVER_KEY || undefined);
  transport = new NostrServerTransport({
    signer,
    relayHandler: opts.relays,
    // Never publish anything to the SDK's default public bootstrap relays (core/constants.js
    // DEFAULT_BOOTSTRAP_RELAY_URLS); the relay list (kind 10002) still goes to our own relays.
    bootstrapRelayUrls: [],
    encryptionMode: process.env.CVM_ENCRYPTION || undefined,
    giftWrapMode: process.env.CVM_GIFT_WRAP || undefined,
    logLevel: process.env.LOG_LEVEL,
  });
  if (opts.nwc) {
    const nn = process.env.CVM_NWC_NOTIFICATIONS;
    transport = withServerPayments(transport, {
      processors: [
        new LnBolt11NwcPaymentProcessor({
          nwcConnectionString: opts.nwc,
          enableNotificationVerification: nn === '1' ? true : nn === '0' ? false : undefined,
        }),
      ],
      pricedCapabilities: [
        { method: 'tools/call', name: 'search', amount: opts.price, currencyUnit: 'sats', description: 'a search' },
      ],
    });
  } else {
    log('no --nwc/CVM_NWC: serving without payments');
  }
} catch (e) {
  usage(e instanceof Error ? e.message : String(e));
}

let closing = false;
async function shutdown(why, code = 0) {
  if (closing) return;
  closing = true;
  log(`shutting down (${why})`);
  const timer = setTimeout(() => process.exit(code), 3000);
  timer.unref();
  await mcp.close().catch((e) => log('close:', e?.message ?? e));
  process.exit(code);
}
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
process.stdin.on('end', () => shutdown('stdin closed'));
process.stdin.on('error', () => shutdown('stdin error'));
process.stdin.resume();

const timeoutMs = Number(process.env.CVM_TIMEOUT_MS ?? 30000);
const t0 = performance.now();
try {
  await Promise.race([
    (async () => {
      // NostrServerTransport.start(): connect, subscribe, publish kind 10002 (through a second,
      // short-lived relay pool: nostr-server-transport.js publishEventToRelayUrls).
      await mcp.connect(transport);
      // start() does not wait for the relays to have our REQ. A throwaway REQ on the same relay
      // connection, answered by EOSE, proves the relays have processed the subscription before it
      // (a relay handles one connection's messages in order), so no request can be missed.
      await barrier(transport.relayHandler, timeoutMs);
    })(),
    new Promise((_, reject) =>
      setTimeout(() => reject(new Error(`not ready after ${timeoutMs} ms (CVM_TIMEOUT_MS)`)), timeoutMs).unref(),
    ),
  ]);
} catch (e) {
  log('start failed:', e?.message ?? e);
  await shutdown('start failed', 1);
}
log(`ready in ${Math.round(performance.now() - t0)} ms`);
process.stdout.write(JSON.stringify({ pubkey: await signer.getPublicKey() }) + '\n');

function barrier(relayHandler, timeoutMs) {
  return new Promise((resolve, reject) => {
    let unsub = null;
    let done = false;
    const finish = (err) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      unsub?.();
      err ? reject(err) : resolve();
    };
    const timer = setTimeout(() => finish(new Error(`relays gave no EOSE in ${timeoutMs} ms`)), timeoutMs);
    relayHandler
      .subscribe([{ ids: ['0'.repeat(64)], limit: 1 }], () => {}, () => finish())
      .then((u) => (done ? u() : (unsub = u)), finish);
  });
}
