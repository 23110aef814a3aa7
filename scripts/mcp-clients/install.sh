#!/usr/bin/env bash
# Installs the independent MCP clients' SDKs: the official TypeScript SDK (npm
# @modelcontextprotocol/sdk, pinned in scripts/mcp-clients/package-lock.json) into
# scripts/mcp-clients/node_modules, and the official Python SDK (PyPI mcp and all its dependencies,
# pinned in scripts/mcp-clients/requirements.txt) into a virtualenv at /var/tmp/mcp-clients-venv
# (override with MCP_CLIENTS_VENV). Idempotent: each half does nothing when a stamp holds the
# sha256 of its lock file (node_modules/.stipendex-lock.sha256, <venv>/.stipendex-requirements.sha256).
#
# - npm ci, never npm install: the lock file is the truth, versions are pinned exactly.
# - The npm cache lives outside the repository (default /var/tmp/stipendex-npm-cache; override
#   with STIPENDEX_NPM_CACHE), so CI and later sessions on the same machine reinstall offline-fast.
# - Needs node >= 20 with npm, and python3 >= 3.10 with its venv module, on PATH (PYTHON picks
#   another interpreter). Set MCP_CLIENTS_INSTALL_FORCE=1 to reinstall anyway.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
log() { printf 'mcp-clients/install: %s\n' "$*" >&2; }

command -v node >/dev/null || { log "node not found (need node >= 20)"; exit 1; }
command -v npm >/dev/null || { log "npm not found"; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then log "node $(node -v) is too old (need >= 20)"; exit 1; fi
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { log "$python not found (need python >= 3.10 with venv)"; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { log "$("$python" -V 2>&1) is too old (need >= 3.10)"; exit 1; }

force="${MCP_CLIENTS_INSTALL_FORCE:-}"
start=$(date +%s)

# The TypeScript SDK.
stamp=node_modules/.stipendex-lock.sha256
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ "$force" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  log "node_modules up to date"
else
  export npm_config_cache="${STIPENDEX_NPM_CACHE:-/var/tmp/stipendex-npm-cache}"
  mkdir -p "$npm_config_cache"
  log "npm ci (cache $npm_config_cache)"
  npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2
  node -e 'import("@modelcontextprotocol/sdk/client/index.js")' \
    || { log "the TypeScript SDK did not install"; exit 1; }
  echo "$want" > "$stamp"
fi

# The Python SDK.
venv="${MCP_CLIENTS_VENV:-/var/tmp/mcp-clients-venv}"
vstamp="$venv/.stipendex-requirements.sha256"
vwant="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [[ "$force" != 1 && -f "$vstamp" && "$(cat "$vstamp")" == "$vwant" && -x "$venv/bin/python" ]]; then
  log "virtualenv $venv up to date"
else
  log "pip install -r requirements.txt into $venv (PyPI)"
  # A fresh virtualenv each time: the lock is then all that is in it.
  rm -rf "$venv"
  "$python" -m venv "$venv" \
    || { log "could not make a virtualenv with $python (on Debian: apt-get install python3-venv)"; exit 1; }
  "$venv/bin/pip" install -q --disable-pip-version-check --require-virtualenv -r requirements.txt >&2
  "$venv/bin/pip" check --disable-pip-version-check >&2
  "$venv/bin/python" -c 'import mcp, mcp.client.streamable_http' \
    || { log "the Python SDK did not install"; exit 1; }
  echo "$vwant" > "$vstamp"
fi
log "ready in $(( $(date +%s) - start )) s"
