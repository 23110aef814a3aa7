#!/usr/bin/env bash
# Regenerates rail-x402/tests/data/OwnedWallet.bin from OwnedWallet.sol with solc-js 0.8.26
# (npm `solc`, installed into a scratch folder; nothing of it is committed).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="$here/../../rail-x402/tests/data"
scratch="${SOLC_DIR:-/var/tmp/solc}"
mkdir -p "$scratch"
( cd "$scratch" && [[ -x node_modules/.bin/solcjs ]] || npm install --no-audit --no-fund --prefix "$scratch" solc@0.8.26 >&2 )
out="$(mktemp -d)"
"$scratch/node_modules/.bin/solcjs" --bin --optimize -o "$out" "$data/OwnedWallet.sol" >&2
tr -d '\n' < "$out"/*OwnedWallet.bin > "$data/OwnedWallet.bin"
rm -rf "$out"
echo "wrote $data/OwnedWallet.bin ($(wc -c < "$data/OwnedWallet.bin") hex chars)"
