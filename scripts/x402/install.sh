#!/usr/bin/env bash
# Installs the x402 localnet + reference stack (scripts/x402/package-lock.json) from the npm
# registry into scripts/x402/node_modules. Idempotent: does nothing when node_modules already
# matches package-lock.json (a stamp holds the lock file's sha256) and the anvil binary is there.
#
# - npm ci, never npm install: the lock file is the truth, versions are pinned exactly.
# - The npm cache lives outside the repository (default /var/tmp/stipendex-npm-cache; override
#   with STIPENDEX_NPM_CACHE), so CI and later sessions on the same machine reinstall offline-fast.
# - Needs node >= 20 and npm on PATH. Set X402_INSTALL_FORCE=1 to reinstall anyway.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
log() { printf 'x402/install: %s\n' "$*" >&2; }

command -v node >/dev/null || { log "node not found (need node >= 20)"; exit 1; }
command -v npm >/dev/null || { log "npm not found"; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then log "node $(node -v) is too old (need >= 20)"; exit 1; fi

stamp=node_modules/.stipendex-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
anvil_bin=node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil
if [[ "${X402_INSTALL_FORCE:-}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$anvil_bin" ]]; then
  log "up to date"
  exit 0
fi

export npm_config_cache="${STIPENDEX_NPM_CACHE:-/var/tmp/stipendex-npm-cache}"
mkdir -p "$npm_config_cache"
log "npm ci (cache $npm_config_cache)"
start=$(date +%s)
npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2
# The anvil binary ships inside the registry package; make sure it is executable and runs.
chmod +x "$anvil_bin"
"$anvil_bin" --version >/dev/null
echo "$want" > "$stamp"
log "installed in $(( $(date +%s) - start )) s"
