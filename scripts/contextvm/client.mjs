#!/usr/bin/env node
// A ContextVM client on the TypeScript SDK (npm @contextvm/sdk 0.11.14, pinned in package-lock.json):
// the MCP SDK's Client over the SDK's NostrClientTransport, paying CEP-8 payment_required
// notifications with the SDK's NWC handler (withClientPayments + LnBolt11NwcPaymentHandler).
// See README.md.
//
//   node client.mjs [--relay URL]... [--server HEX] [--nwc URI] [--tool NAME] [--args JSON]
//                   [--count N] [--list] [--bench SECONDS [--concurrency C]]
//
// Env (argv wins): CVM_RELAYS (comma-separated relay URLs), CVM_SERVER_PUBKEY (hex, npub or
// nprofile), CVM_NWC (the paying wallet's nostr+walletconnect:// URI; without it nothing is paid),
// CVM_TOOL, CVM_ARGS (a JSON object, default {}), CVM_COUNT (default 1), CVM_TIMEOUT_MS (default
// 30000: bounds the connection and each call), CVM_CLIENT_KEY (hex; default a fresh key),
// CVM_ENCRYPTION (optional|required|disabled), CVM_GIFT_WRAP (optional|ephemeral|persistent),
// LOG_LEVEL (the SDK's pino level; default error here; logs go to stderr).
//
// stdout, one JSON object a line:
//   --list:      {"tools":["echo","search"]}                      (before any call)
//   each call:   {"ok":true,"text":"<first text content>","ms":12,"paid_sats":10}
//                {"ok":false,"error":"...","ms":30001}
//   --bench S:   {"calls":n,"errors":e,"per_sec":x,"p50_ms":y,"p99_ms":z}  (C calls in flight on one
//                client for S seconds; no per-call lines)
// Exit 0 when the connection and every call succeeded, 1 otherwise, 2 on a usage error.
//
// Follows (in node_modules/@contextvm/sdk/dist/esm/): transport/nostr-client-transport.d.ts,
// transport/base-nostr-transport.d.ts, payments/client-payments.d.ts,
// payments/handlers/ln-bolt11-nwc-payment-handler.{d.ts,js}, signer/private-key-signer.js,
// core/utils/logger.js (LOG_LEVEL is read once, when the SDK module loads: hence the dynamic imports).
process.env.LOG_LEVEL ??= 'error';
if (process.env.LOG_DESTINATION === 'stdout') delete process.env.LOG_DESTINATION; // stdout is ours

const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
const { NostrClientTransport, PrivateKeySigner, withClientPayments, LnBolt11NwcPaymentHandler } =
  await import('@contextvm/sdk');

const log = (...parts) => console.error('client.mjs:', ...parts);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const errText = (e) => (e instanceof Error ? e.message : String(e));
function usage(msg) {
  log(msg);
  log('usage: client.mjs [--relay URL]... [--server HEX] [--nwc URI] [--tool NAME] [--args JSON]');
  log('                  [--count N] [--list] [--bench SECONDS [--concurrency C]]');
  process.exit(2);
}

const env = process.env;
const opts = {
  relays: (env.CVM_RELAYS ?? '').split(',').filter(Boolean),
  server: env.CVM_SERVER_PUBKEY || null,
  nwc: env.CVM_NWC || null,
  tool: env.CVM_TOOL || null,
  args: env.CVM_ARGS || '{}',
  count: Number(env.CVM_COUNT ?? 1),
  list: false,
  bench: null,
  concurrency: 1,
  timeoutMs: Number(env.CVM_TIMEOUT_MS ?? 30000),
};
const argv = process.argv.slice(2);
for (let i = 0, relaysFromArgv = false; i < argv.length; i++) {
  const a = argv[i];
  if (a === '--list') {
    opts.list = true;
    continue;
  }
  const v = argv[++i];
  if (v === undefined) usage(`${a} needs a value`);
  if (a === '--relay') {
    if (!relaysFromArgv) opts.relays = [];
    relaysFromArgv = true;
    opts.relays.push(v);
  } else if (a === '--server') opts.server = v;
  else if (a === '--nwc') opts.nwc = v;
  else if (a === '--tool') opts.tool = v;
  else if (a === '--args') opts.args = v;
  else if (a === '--count') opts.count = Number(v);
  else if (a === '--bench') opts.bench = Number(v);
  else if (a === '--concurrency') opts.concurrency = Number(v);
  else usage(`unknown argument '${a}'`);
}
if (opts.relays.length === 0) usage('no relay: give --relay URL or CVM_RELAYS');
if (!opts.server) usage('no server: give --server HEX or CVM_SERVER_PUBKEY');
if (!opts.tool && !opts.list) usage('nothing to do: give --tool NAME and/or --list');
let toolArgs;
try {
  toolArgs = JSON.parse(opts.args);
} catch (e) {
  usage(`--args is not JSON: ${errText(e)}`);
}
if (toolArgs === null || typeof toolArgs !== 'object' || Array.isArray(toolArgs)) usage('--args must be a JSON object');
for (const [k, v] of [['--count', opts.count], ['--concurrency', opts.concurrency], ['--timeout', opts.timeoutMs]]) {
  if (!(Number.isInteger(v) && v > 0)) usage(`${k} must be a positive integer`);
}
if (opts.bench !== null && !(opts.bench > 0)) usage('--bench takes a positive number of seconds');

// Payments: the SDK's handler, wrapped only to count what it paid and keep its last error (the SDK
// just logs a failed payment; the call then runs into its timeout, so we name the cause).
let paidSats = 0;
let lastPaymentError = null;
let transport, nwc;
try { // both constructors validate their input (server identity, NWC URI): a usage error
  transport = new NostrClientTransport({
    signer: new PrivateKeySigner(env.CVM_CLIENT_KEY || undefined),
    serverPubkey: opts.server,
    relayHandler: opts.relays,
    encryptionMode: env.CVM_ENCRYPTION || undefined,
    giftWrapMode: env.CVM_GIFT_WRAP || undefined,
    logLevel: env.LOG_LEVEL,
  });
  if (opts.nwc) nwc = new LnBolt11NwcPaymentHandler({ nwcConnectionString: opts.nwc });
} catch (e) {
  usage(errText(e));
}
if (nwc) {
  const handler = {
    pmi: nwc.pmi,
    async handle(req) {
      try {
        await nwc.handle(req);
        paidSats += req.amount;
      } catch (e) {
        lastPaymentError = errText(e);
        throw e;
      }
    },
  };
  transport = withClientPayments(transport, { handlers: [handler] });
}

const client = new Client({ name: 'stipendex-contextvm-client', version: '0.0.0' });
let failed = false;

async function callOnce() {
  const t0 = performance.now();
  const paidBefore = paidSats;
  lastPaymentError = null;
  try {
    const res = await client.callTool({ name: opts.tool, arguments: toolArgs }, undefined, { timeout: opts.timeoutMs });
    const ms = Math.round(performance.now() - t0);
    const text = res.content?.find((c) => c.type === 'text')?.text ?? null;
    if (res.isError) return { ok: false, error: `tool error: ${text}`, ms };
    return { ok: true, text, ms, paid_sats: paidSats - paidBefore };
  } catch (e) {
    const why = lastPaymentError ? `${errText(e)} (payment failed: ${lastPaymentError})` : errText(e);
    return { ok: false, error: why, ms: Math.round(performance.now() - t0) };
  }
}

async function bench(seconds, concurrency) {
  const lat = [];
  let errors = 0;
  const t0 = performance.now();
  const deadline = t0 + seconds * 1000;
  const worker = async () => {
    while (performance.now() < deadline) {
      const t = performance.now();
      try {
        const res = await client.callTool({ name: opts.tool, arguments: toolArgs }, undefined, { timeout: opts.timeoutMs });
        if (res.isError) errors++;
        else lat.push(performance.now() - t);
      } catch {
        errors++;
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  const wall = (performance.now() - t0) / 1000;
  lat.sort((a, b) => a - b);
  const pct = (p) => (lat.length ? Math.round(lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] * 10) / 10 : null);
  const calls = lat.length + errors;
  return { calls, errors, per_sec: Math.round((lat.length / wall) * 10) / 10, p50_ms: pct(0.5), p99_ms: pct(0.99) };
}

const withTimeout = (p, ms, what) =>
  Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(`${what} timed out after ${ms} ms`)), ms).unref())]);

try {
  const t0 = performance.now();
  await withTimeout(client.connect(transport, { timeout: opts.timeoutMs }), opts.timeoutMs, 'connect');
  log(`connected in ${Math.round(performance.now() - t0)} ms`);
  if (opts.list) {
    const { tools } = await client.listTools(undefined, { timeout: opts.timeoutMs });
    out({ tools: tools.map((t) => t.name) });
  }
  if (opts.tool && opts.bench !== null) {
    const r = await bench(opts.bench, opts.concurrency);
    out(r);
    if (r.errors > 0 || r.calls === 0) failed = true;
  } else if (opts.tool) {
    for (let i = 0; i < opts.count; i++) {
      const r = await callOnce();
      out(r);
      if (!r.ok) failed = true;
    }
  }
} catch (e) {
  out({ ok: false, error: errText(e) });
  failed = true;
}
// close() unsubscribes and disconnects the relay pools; never let it hold the exit.
await withTimeout(client.close(), 3000, 'close').catch((e) => log(errText(e)));
process.exit(failed ? 1 : 0);
