#!/usr/bin/env node
// A plain MCP host on the official TypeScript SDK (npm @modelcontextprotocol/sdk, pinned in
// package-lock.json). Same command line and same output as client.py (the Python SDK); see
// README.md.
//
//   node client.mjs [--steps FILE] [--header 'Name: value']... (--url URL | --stdio CMD [ARG...])
//
// Steps come from --steps FILE (a JSON array) or the env var MCP_STEPS (a JSON string). One JSON
// object is printed on stdout at the end; logs go to stderr. Exit 0 unless the connection failed.
// Env: ELICIT=accept|decline|none (default none: no elicitation capability), MCP_TIMEOUT_MS (per
// request, default 60000).
import { readFileSync } from 'node:fs';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema, McpError } from '@modelcontextprotocol/sdk/types.js';

const SDK_VERSION = JSON.parse(
  readFileSync(new URL('./node_modules/@modelcontextprotocol/sdk/package.json', import.meta.url), 'utf8'),
).version;
const CLIENT_ID = `typescript-sdk@${SDK_VERSION}`;

const log = (...parts) => console.error('client.mjs:', ...parts);

function usage(msg) {
  process.stderr.write(
    `client.mjs: ${msg}\n` +
      "usage: client.mjs [--steps FILE] [--header 'Name: value']... (--url URL | --stdio CMD [ARG...])\n",
  );
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { headers: {}, stepsFile: null, url: null, stdio: null };
  for (let i = 0; i < argv.length; ) {
    const a = argv[i];
    if (a === '--stdio') {
      opts.stdio = argv.slice(i + 1);
      if (opts.stdio.length === 0) usage('--stdio needs a command');
      break;
    }
    if (a === '--url' || a === '--steps' || a === '--header') {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      const v = argv[i + 1];
      if (a === '--url') opts.url = v;
      else if (a === '--steps') opts.stepsFile = v;
      else {
        const at = v.indexOf(':');
        if (at < 0) usage("--header takes 'Name: value'");
        opts.headers[v.slice(0, at).trim()] = v.slice(at + 1).trim();
      }
      i += 2;
      continue;
    }
    usage(`unknown argument '${a}'`);
  }
  if ((opts.url === null) === (opts.stdio === null)) usage('give exactly one of --url URL and --stdio CMD [ARG...]');
  return opts;
}

function loadSteps(stepsFile) {
  let steps;
  try {
    if (stepsFile !== null) steps = JSON.parse(readFileSync(stepsFile, 'utf8'));
    else if (process.env.MCP_STEPS) steps = JSON.parse(process.env.MCP_STEPS);
    else usage('no steps: give --steps FILE or MCP_STEPS');
  } catch (e) {
    usage(`cannot read the steps: ${e.message}`);
  }
  if (!Array.isArray(steps) || !steps.every((s) => s && typeof s === 'object' && !Array.isArray(s))) {
    usage('the steps must be a JSON array of objects');
  }
  return steps;
}

// Sorted keys, so that both clients print the same bytes for the same data.
function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === 'object') {
    const out = {};
    for (const k of Object.keys(value).sort()) if (value[k] !== undefined) out[k] = canonical(value[k]);
    return out;
  }
  return value;
}

function errorEntry(e) {
  if (e instanceof McpError) {
    // McpError's message is "MCP error <code>: <message>"; give the wire's message back.
    const prefix = `MCP error ${e.code}: `;
    const err = { code: e.code, message: e.message.startsWith(prefix) ? e.message.slice(prefix.length) : e.message };
    if (e.data !== undefined && e.data !== null) err.data = e.data;
    return err;
  }
  return { message: String(e?.message ?? e), exception: e?.name ?? typeof e };
}

// Every boolean property true; every required string property "yes" (an enum's first value).
function fillAccept(schema) {
  const content = {};
  const props = schema?.properties ?? {};
  const required = new Set(schema?.required ?? []);
  for (const [name, prop] of Object.entries(props)) {
    if (prop?.type === 'boolean') content[name] = true;
    else if (prop?.type === 'string' && required.has(name)) {
      let e = prop.enum;
      if (!e?.length && Array.isArray(prop.oneOf) && prop.oneOf.length) e = prop.oneOf.map((o) => o?.const);
      content[name] = e?.length ? e[0] : 'yes';
    }
  }
  return content;
}

// The SDK keeps no negotiated protocol version on a stdio client: read the initialize answer off
// the wire.
function tapInitialize(transport, onResult) {
  let initId;
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    if (message?.method === 'initialize') initId = message.id;
    return send(message, options);
  };
  let handler;
  Object.defineProperty(transport, 'onmessage', {
    configurable: true,
    get: () =>
      handler &&
      ((message, extra) => {
        if (initId !== undefined && message?.id === initId && message.result) onResult(message.result);
        return handler(message, extra);
      }),
    set: (h) => {
      handler = h;
    },
  });
}

async function runStep(client, step, entry, ctx) {
  const op = step.op;
  const opts = { timeout: ctx.timeoutMs };
  switch (op) {
    case 'info':
      entry.result = ctx.initializeResult;
      break;
    case 'list_tools':
      entry.result = (await client.listTools(undefined, opts)).tools;
      break;
    case 'list_resources':
      entry.result = (await client.listResources(undefined, opts)).resources;
      break;
    case 'list_prompts':
      entry.result = (await client.listPrompts(undefined, opts)).prompts;
      break;
    case 'read_resource':
      entry.result = await client.readResource({ uri: step.uri }, opts);
      break;
    case 'get_prompt':
      entry.result = await client.getPrompt({ name: step.name, arguments: step.arguments }, opts);
      break;
    case 'call_tool': {
      const params = { name: step.name, arguments: step.arguments ?? {} };
      if (step.meta) params._meta = step.meta;
      if (step.progress) {
        entry.progress = [];
        // The SDK sends the request id as progressToken (in params._meta) when onprogress is set.
        opts.onprogress = (p) => {
          const n = { progress: p.progress };
          if (p.total !== undefined) n.total = p.total;
          if (p.message !== undefined) n.message = p.message;
          entry.progress.push(n);
        };
      }
      entry.result = await client.callTool(params, undefined, opts);
      break;
    }
    case 'call_tool_cancel': {
      const params = { name: step.name, arguments: step.arguments ?? {} };
      if (step.meta) params._meta = step.meta;
      entry.after_ms = step.after_ms ?? 0;
      // Aborting the signal is how this SDK cancels: it sends notifications/cancelled and rejects.
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), entry.after_ms);
      try {
        const result = await client.callTool(params, undefined, { ...opts, signal: ac.signal });
        entry.outcome = 'completed';
        entry.result = result;
      } catch (e) {
        if (!ac.signal.aborted) throw e;
        entry.outcome = 'cancelled';
      } finally {
        clearTimeout(timer);
      }
      break;
    }
    default:
      throw Object.assign(new Error(`unknown op '${op}'`), { name: 'ValueError' });
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const steps = loadSteps(opts.stepsFile);
  const elicitMode = (process.env.ELICIT || 'none').toLowerCase();
  if (!['accept', 'decline', 'none'].includes(elicitMode)) usage('ELICIT must be accept, decline or none');
  const timeoutMs = Number(process.env.MCP_TIMEOUT_MS || 60000);

  const out = { client: CLIENT_ID, steps: [], elicitations: [] };
  const print = () => new Promise((resolve) => process.stdout.write(JSON.stringify(canonical(out)) + '\n', resolve));

  const capabilities = elicitMode === 'none' ? {} : { elicitation: { form: {}, url: {} } };
  const client = new Client({ name: 'typescript-sdk', version: SDK_VERSION }, { capabilities });
  client.onerror = (e) => log('error:', e?.message ?? e);
  if (elicitMode !== 'none') {
    client.setRequestHandler(ElicitRequestSchema, async (request) => {
      const p = request.params;
      const entry = { message: p.message };
      if (p.requestedSchema !== undefined) entry.requestedSchema = p.requestedSchema;
      if (p.mode === 'url') entry.url = p.url;
      out.elicitations.push(entry);
      if (elicitMode === 'accept') {
        const content = fillAccept(p.requestedSchema);
        entry.response = { action: 'accept', content };
        log('elicitation: accept', JSON.stringify(content));
        return p.mode === 'url' ? { action: 'accept' } : { action: 'accept', content };
      }
      entry.response = { action: 'decline' };
      log('elicitation: decline');
      return { action: 'decline' };
    });
  }

  let transport;
  if (opts.stdio) {
    const [command, ...args] = opts.stdio;
    // The whole environment goes to the server (the SDK's default passes only a safe few).
    transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: 'inherit' });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers: opts.headers } });
  }
  const ctx = { timeoutMs, initializeResult: undefined };
  tapInitialize(transport, (r) => {
    ctx.initializeResult = r;
  });

  try {
    await client.connect(transport, { timeout: timeoutMs });
  } catch (e) {
    log('connection failed:', e?.message ?? e);
    out.connectError = errorEntry(e);
    await print();
    process.exit(1);
  }
  log('connected:', ctx.initializeResult?.protocolVersion);

  for (const step of steps) {
    const entry = { op: step.op };
    out.steps.push(entry);
    try {
      await runStep(client, step, entry, ctx);
    } catch (e) {
      entry.error = errorEntry(e);
      log(`step ${step.op}: error`, JSON.stringify(entry.error));
    }
  }
  try {
    await client.close();
  } catch (e) {
    log('close:', e?.message ?? e);
    out.closeError = errorEntry(e);
  }
  await print();
  process.exit(0);
}

main().catch((e) => {
  log('failed:', e?.stack ?? e);
  const out = { client: CLIENT_ID, steps: [], elicitations: [], connectError: errorEntry(e) };
  process.stdout.write(JSON.stringify(canonical(out)) + '\n', () => process.exit(1));
});
