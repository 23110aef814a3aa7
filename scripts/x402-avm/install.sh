#!/usr/bin/env bash
# Installs the x402-avm Python SDK (PyPI x402-avm 2.0.2 and its dependencies, pinned in
# scripts/x402-avm/requirements.txt) into a virtualenv of its own at /var/tmp/x402-avm-venv
# (override with X402_AVM_VENV). Idempotent: nothing is done when the stamp
# <venv>/.stipendex-requirements.sha256 holds the lock file's sha256 (X402_AVM_INSTALL_FORCE=1
# reinstalls). Needs python3 >= 3.10 with its venv module (PYTHON picks another interpreter).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
log() { printf 'x402-avm/install: %s\n' "$*" >&2; }

python="${PYTHON:-python3}"
command -v "$python" >/dev/null || { log "$python not found (need python >= 3.10 with venv)"; exit 1; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { log "$("$python" -V 2>&1) is too old (need >= 3.10)"; exit 1; }

venv="${X402_AVM_VENV:-/var/tmp/x402-avm-venv}"
stamp="$venv/.stipendex-requirements.sha256"
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
start=$(date +%s)
if [[ "${X402_AVM_INSTALL_FORCE:-}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$venv/bin/python" ]]; then
  log "virtualenv $venv up to date"
  exit 0
fi
log "pip install -r requirements.txt into $venv (PyPI)"
rm -rf "$venv"
"$python" -m venv "$venv" \
  || { log "could not make a virtualenv with $python (on Debian: apt-get install python3-venv)"; exit 1; }
"$venv/bin/pip" install -q --disable-pip-version-check --require-virtualenv -r requirements.txt >&2
"$venv/bin/pip" check --disable-pip-version-check >&2
"$venv/bin/python" -c 'import x402.mechanisms.avm.exact, algosdk, fastapi, uvicorn, httpx' \
  || { log "the SDK did not install"; exit 1; }
echo "$want" > "$stamp"
log "ready in $(( $(date +%s) - start )) s"
