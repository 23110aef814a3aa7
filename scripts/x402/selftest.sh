#!/usr/bin/env bash
# Self-test of the x402 localnet and the reference TypeScript stack, end to end:
#   install.sh -> localnet.mjs (anvil + FiatTokenV2_2 + Multicall3) -> ref-facilitator.mjs ->
#   ref-server.mjs -> unpaid GET /weather is 402 -> ref-pay.mjs pays GET /weather ->
#   payTo's token balance rose by exactly the price -> probe-facilitator.mjs (verify/settle cases)
# then tears everything down (only the processes it started, by pid).
# Prints timings and a closing "selftest: N passed, N failed" line; exits non-zero on any failure.
# Logs stay in $X402_SELFTEST_DIR (default: a fresh mktemp dir, removed on success).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

work="${X402_SELFTEST_DIR:-$(mktemp -d /tmp/x402-selftest.XXXXXX)}"
mkdir -p "$work"
pids=()
passed=0
failed=0

log() { printf 'selftest: %s\n' "$*" >&2; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
check() { # check NAME CONDITION-EXIT-CODE
  if [[ "$2" == 0 ]]; then passed=$((passed + 1)); log "PASS $1"; else failed=$((failed + 1)); log "FAIL $1"; fi
}
cleanup() {
  local rc=$?
  for (( i=${#pids[@]}-1; i>=0; i-- )); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ $rc -eq 0 && $failed -eq 0 && -z "${X402_SELFTEST_DIR:-}" ]]; then rm -rf "$work"; else log "logs kept in $work"; fi
}
trap cleanup EXIT

# wait_line FILE REGEX PID TIMEOUT_S: waits until FILE has a line matching REGEX; prints it.
wait_line() {
  local file=$1 re=$2 pid=$3 deadline=$(( $(date +%s) + $4 )) line
  while :; do
    if line=$(grep -m1 -E "$re" "$file" 2>/dev/null); then printf '%s\n' "$line"; return 0; fi
    kill -0 "$pid" 2>/dev/null || { log "process $pid died; see $file and its .err"; return 1; }
    (( $(date +%s) < deadline )) || { log "timeout waiting for /$re/ in $file"; return 1; }
    sleep 0.05
  done
}

./install.sh

# --- localnet --------------------------------------------------------------------------------
t=$(now_ms)
node localnet.mjs --env-out "$work/localnet.env" >"$work/localnet.out" 2>"$work/localnet.err" &
pids+=($!)
wait_line "$work/localnet.out" '^X402_LOCALNET ' "${pids[-1]}" 60 >/dev/null
localnet_ms=$(( $(now_ms) - t ))
# shellcheck disable=SC1091
source "$work/localnet.env"
log "localnet ready in ${localnet_ms} ms at $X402_RPC_URL, token $X402_TOKEN"

# --- reference facilitator and server ---------------------------------------------------------
PORT=0 node ref-facilitator.mjs >"$work/facilitator.out" 2>"$work/facilitator.err" &
pids+=($!)
X402_FACILITATOR_URL=$(wait_line "$work/facilitator.out" '^Listening on http' "${pids[-1]}" 30 | sed 's/^Listening on //')
export X402_FACILITATOR_URL
export X402_PRICE=1000
PORT=0 node ref-server.mjs >"$work/server.out" 2>"$work/server.err" &
pids+=($!)
server_url=$(wait_line "$work/server.out" '^Listening on http' "${pids[-1]}" 30 | sed 's/^Listening on //')
log "facilitator $X402_FACILITATOR_URL, server $server_url"

# Token balance via viem (no foundry `cast` needed).
balance_of() {
  node --input-type=module -e '
    import { createPublicClient, http, erc20Abi } from "viem";
    const c = createPublicClient({ transport: http(process.env.X402_RPC_URL) });
    console.log(String(await c.readContract({ address: process.env.X402_TOKEN, abi: erc20Abi, functionName: "balanceOf", args: [process.argv[1]] })));
  ' "$1"
}

# --- checks ----------------------------------------------------------------------------------
code=$(curl -s -o /dev/null -w '%{http_code}' "$server_url/health"); [[ $code == 200 ]]; check "free route /health is 200" $?
hdr=$(curl -s -D - -o /dev/null "$server_url/weather")
grep -q '^HTTP/1.1 402' <<<"$hdr" && grep -qi '^PAYMENT-REQUIRED: ' <<<"$hdr"; check "unpaid /weather is 402 with PAYMENT-REQUIRED" $?

before=$(balance_of "$X402_PAY_TO")
t=$(now_ms)
set +e
pay_json=$(node ref-pay.mjs "$server_url/weather" 2>"$work/pay.err")
pay_rc=$?
set -e
pay_ms=$(( $(now_ms) - t ))
printf '%s\n' "$pay_json" >"$work/pay.json"
check "ref-pay exits 0" $pay_rc
node -e '
  const r = JSON.parse(process.argv[1]);
  const ok = r.status === 200 && r.paymentResponse?.success === true && /^0x[0-9a-f]{64}$/.test(r.paymentResponse.transaction)
    && r.paymentResponse.network === process.env.X402_NETWORK && r.body?.report?.weather === "sunny"
    && r.paymentRequired?.x402Version === 2 && r.paymentRequired.accepts[0].amount === process.env.X402_PRICE;
  process.exit(ok ? 0 : 1);
' "$pay_json"; check "paid /weather: 200, body, PAYMENT-RESPONSE success, PAYMENT-REQUIRED seen" $?
after=$(balance_of "$X402_PAY_TO")
[[ $(( after - before )) == "$X402_PRICE" ]]; check "payTo balance rose by the price ($before -> $after)" $?
in_process_ms=$(node -p 'JSON.parse(process.argv[1]).elapsedMs' "$pay_json" 2>/dev/null || echo '?')

# Facilitator API cases (second payer, so its nonces/balance are independent of ref-pay's).
set +e
X402_PAYER_KEY=$(cut -d, -f2 <<<"$X402_PAYER_KEYS") node probe-facilitator.mjs "$X402_FACILITATOR_URL" >"$work/probe.out" 2>"$work/probe.err"
probe_rc=$?
set -e
check "probe-facilitator ($(tail -n1 "$work/probe.out"))" $probe_rc

log "timings: localnet ready ${localnet_ms} ms; one paid request ${pay_ms} ms wall incl. node start (${in_process_ms} ms inside ref-pay: 402 + sign + verify + settle + receipt)"
echo "selftest: $passed passed, $failed failed"
[[ $failed == 0 ]]
