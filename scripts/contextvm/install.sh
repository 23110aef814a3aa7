#!/usr/bin/env bash
# Installs the ContextVM TypeScript SDK (npm @contextvm/sdk 0.11.14 and its dependency tree, pinned
# in scripts/contextvm/package-lock.json) into scripts/contextvm/node_modules, for client.mjs and
# server.mjs. Idempotent: does nothing when a stamp (node_modules/.stipendex-lock.sha256) holds the
# sha256 of package-lock.json. Same scheme as the node half of scripts/mcp-clients/install.sh.
#
# - npm ci, never npm install: the lock file is the truth, versions are pinned exactly.
# - The npm cache lives outside the repository (default /var/tmp/stipendex-npm-cache; override
#   with STIPENDEX_NPM_CACHE), so CI and later sessions on the same machine reinstall offline-fast.
# - Needs node >= 20 and npm on PATH. Set CONTEXTVM_INSTALL_FORCE=1 to reinstall anyway.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
log() { printf 'contextvm/install: %s\n' "$*" >&2; }

command -v node >/dev/null || { log "node not found (need node >= 20)"; exit 1; }
command -v npm >/dev/null || { log "npm not found"; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then log "node $(node -v) is too old (need >= 20)"; exit 1; fi

stamp=node_modules/.stipendex-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ "${CONTEXTVM_INSTALL_FORCE:-}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  log "up to date"
  exit 0
fi

export npm_config_cache="${STIPENDEX_NPM_CACHE:-/var/tmp/stipendex-npm-cache}"
mkdir -p "$npm_config_cache"
log "npm ci (cache $npm_config_cache)"
start=$(date +%s%N)
npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2
# Both SDKs must load (ESM), with the payment classes client.mjs and server.mjs use.
node --input-type=module -e '
  const cvm = await import("@contextvm/sdk");
  for (const n of ["NostrClientTransport", "NostrServerTransport", "withClientPayments", "withServerPayments",
                   "LnBolt11NwcPaymentHandler", "LnBolt11NwcPaymentProcessor", "PrivateKeySigner"])
    if (typeof cvm[n] !== "function") throw new Error("@contextvm/sdk lacks " + n);
  await import("@modelcontextprotocol/sdk/client/index.js");
  await import("@modelcontextprotocol/sdk/server/mcp.js");
' || { log "the ContextVM SDK did not install"; exit 1; }
echo "$want" > "$stamp"
log "installed $(node -p 'require("./node_modules/@contextvm/sdk/package.json").version') in $(( ($(date +%s%N) - start) / 1000000 )) ms"
