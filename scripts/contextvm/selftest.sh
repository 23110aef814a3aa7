#!/usr/bin/env bash
# Self-test of the ContextVM TypeScript SDK scripts against the Rust NWC devnet, no Rust code of
# ours in the payment path but the devnet's relay and wallets:
#   install.sh -> nwc-devnet (wallets agent, shop) -> server.mjs paid by the shop wallet ->
#   client.mjs --list, echo (free), search (paid: CEP-8 payment_required -> NWC pay_invoice from
#   the agent wallet -> the server's NWC processor sees it settled -> the result) -> search without a
#   wallet must fail (the price gates it) -> a 2 s bench of echo.
# Then tears down only the processes it started, by pid.
# Prints a closing "selftest: N passed, N failed" line; exits non-zero on any failure.
# NWC_DEVNET picks the devnet binary (default target/debug/nwc-devnet; it is not built here).
# Outputs and logs stay in $CONTEXTVM_SELFTEST_DIR (default: a fresh mktemp dir, removed on success).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

devnet="${NWC_DEVNET:-$here/../../target/debug/nwc-devnet}"
work="${CONTEXTVM_SELFTEST_DIR:-$(mktemp -d /tmp/contextvm-selftest.XXXXXX)}"
mkdir -p "$work"
pids=()
passed=0
failed=0

log() { printf 'selftest: %s\n' "$*" >&2; }
holds() { "$@" >/dev/null 2>&1 && echo 0 || echo 1; } # holds CMD...: 0 if CMD succeeds, else 1
check() { # check NAME CONDITION-EXIT-CODE
  if [[ "$2" == 0 ]]; then passed=$((passed + 1)); log "PASS $1"; else failed=$((failed + 1)); log "FAIL $1"; fi
}
cleanup() {
  local rc=$?
  for (( i=${#pids[@]}-1; i>=0; i-- )); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  log "$passed passed, $failed failed"
  if [[ $rc -eq 0 && $failed -eq 0 && -z "${CONTEXTVM_SELFTEST_DIR:-}" ]]; then rm -rf "$work"; else log "logs kept in $work"; fi
}
trap cleanup EXIT
wait_for() { # wait_for FILE PATTERN PID WHAT: until FILE has a line matching PATTERN (10 s)
  for _ in $(seq 1 200); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { log "$4 died; see $work"; exit 1; }
    sleep 0.05
  done
  log "$4 did not start; see $work"; exit 1
}

./install.sh
[[ -x "$devnet" ]] || { log "no devnet binary at $devnet (cargo build --bin nwc-devnet)"; exit 1; }

# --- the devnet: one relay, wallets agent (1 000 000 msat) and shop (0) ----------------------
"$devnet" --wallet agent=1000000 --wallet shop=0 >"$work/devnet.out" 2>"$work/devnet.err" </dev/null &
pids+=($!)
wait_for "$work/devnet.out" '^wallet shop ' "${pids[-1]}" "the devnet"
relay=$(awk '$1 == "relay" {print $2}' "$work/devnet.out")
agent=$(awk '$1 == "wallet" && $2 == "agent" {print $3}' "$work/devnet.out")
shop=$(awk '$1 == "wallet" && $2 == "shop" {print $3}' "$work/devnet.out")
log "devnet relay $relay"

# --- the server, paid into the shop wallet; stdin is a pipe we hold open ----------------------
mkfifo "$work/server.stdin"
node server.mjs --relay "$relay" --nwc "$shop" <"$work/server.stdin" >"$work/server.out" 2>"$work/server.err" &
pids+=($!)
exec 3>"$work/server.stdin"
wait_for "$work/server.out" '"pubkey"' "${pids[-1]}" "server.mjs"
server=$(jq -r .pubkey "$work/server.out")
log "server pubkey $server"

client() { # client NAME ARG...: runs client.mjs, keeps its stdout in $work/NAME.out, returns its exit code
  local name=$1; shift
  local t0=$(date +%s%N) rc=0
  node client.mjs --relay "$relay" --server "$server" "$@" >"$work/$name.out" 2>"$work/$name.err" || rc=$?
  log "$name: exit $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms:"
  sed 's/^/    /' "$work/$name.out" >&2
  return $rc
}

rc=0; client paid --nwc "$agent" --list --tool echo --args '{"q":"hello"}' || rc=$?
check "client --list exits 0" $rc
check "tools are echo, search" "$(holds jq -e -s '.[0].tools | sort == ["echo","search"]' "$work/paid.out")"
check "echo is free" "$(holds jq -e -s '.[1] | .ok == true and .text == "echo: hello" and .paid_sats == 0' "$work/paid.out")"

rc=0; client search --nwc "$agent" --tool search --args '{"q":"sats"}' --count 2 || rc=$?
check "paid search exits 0" $rc
check "search twice through CEP-8 + NWC, 10 sats each" "$(holds jq -e -s 'length == 2 and all(.ok == true and .text == "search: sats" and .paid_sats == 10)' "$work/search.out")"

rc=0; CVM_TIMEOUT_MS=3000 client unpaid --tool search --args '{"q":"free?"}' || rc=$?
check "search without a wallet exits 1" "$(holds test "$rc" = 1)"
check "search without a wallet is not served" "$(holds jq -e -s '.[0].ok == false' "$work/unpaid.out")"

rc=0; client bench --tool echo --args '{"q":"b"}' --bench 2 --concurrency 4 || rc=$?
check "bench exits 0" $rc
check "bench counted calls without errors" "$(holds jq -e -s '.[0] | .calls > 0 and .errors == 0 and .per_sec > 0' "$work/bench.out")"

exec 3>&-   # stdin closes: the server must exit on its own
for _ in $(seq 1 100); do kill -0 "${pids[1]}" 2>/dev/null || break; sleep 0.05; done
alive=0; kill -0 "${pids[1]}" 2>/dev/null && alive=1
check "server.mjs exits when stdin closes" "$alive"
[[ $failed == 0 ]]
