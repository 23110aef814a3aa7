#!/usr/bin/env bash
# Self-test of the two independent MCP clients (client.mjs: TypeScript SDK; client.py: Python SDK)
# against selftest_server.py (the Python SDK's MCPServer), over stdio and over Streamable HTTP:
#   install.sh -> selftest_server.py --http 0 -> for each client (TypeScript; Python in its default
#   mode, which negotiates 2026-07-28 with this server; Python with MCP_PY_MODE=legacy, which
#   negotiates 2025-11-25 by initialize) and each transport: the whole step list with ELICIT=accept,
#   each op checked -> the TypeScript and the legacy Python outputs are the same, step by step ->
#   ELICIT=decline and ELICIT=none with both SDKs -> a refused connection exits 1 with connectError.
# Then tears the server down (only the process it started, by pid).
# Prints a closing "selftest: N passed, N failed" line; exits non-zero on any failure.
# Outputs and logs stay in $MCP_CLIENTS_SELFTEST_DIR (default: a fresh mktemp dir, removed on success).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

work="${MCP_CLIENTS_SELFTEST_DIR:-$(mktemp -d /tmp/mcp-clients-selftest.XXXXXX)}"
mkdir -p "$work"
pids=()
passed=0
failed=0

log() { printf 'selftest: %s\n' "$*" >&2; }
check() { # check NAME CONDITION-EXIT-CODE
  if [[ "$2" == 0 ]]; then passed=$((passed + 1)); log "PASS $1"; else failed=$((failed + 1)); log "FAIL $1"; fi
}
cleanup() {
  local rc=$?
  for (( i=${#pids[@]}-1; i>=0; i-- )); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ $rc -eq 0 && $failed -eq 0 && -z "${MCP_CLIENTS_SELFTEST_DIR:-}" ]]; then rm -rf "$work"; else log "logs kept in $work"; fi
}
trap cleanup EXIT

./install.sh
py="${MCP_CLIENTS_VENV:-/var/tmp/mcp-clients-venv}/bin/python"

# --- the server over Streamable HTTP (stdio servers are started by the clients) ---------------
"$py" selftest_server.py --http 0 >"$work/server.out" 2>"$work/server.err" </dev/null &
pids+=($!)
url=
for _ in $(seq 1 200); do
  url=$(grep -m1 -oE 'Uvicorn running on http://[0-9.:]+' "$work/server.err" 2>/dev/null | sed 's/^Uvicorn running on //') && [[ -n "$url" ]] && break
  kill -0 "${pids[-1]}" 2>/dev/null || { log "the server died; see $work/server.err"; exit 1; }
  sleep 0.05
done
[[ -n "$url" ]] || { log "the server did not start; see $work/server.err"; exit 1; }
url="$url/mcp"
log "server at $url"

cat >"$work/steps.json" <<'EOF'
[
  {"op": "info"},
  {"op": "list_tools"},
  {"op": "call_tool", "name": "echo", "arguments": {"text": "hi"}, "meta": {"x402/payment": {"payload": "opaque", "n": 1}}},
  {"op": "call_tool", "name": "count", "arguments": {"n": 3}, "progress": true},
  {"op": "call_tool", "name": "confirm_action", "arguments": {}},
  {"op": "call_tool", "name": "fail_with", "arguments": {"code": -32402, "message": "Payment required", "data": {"x402Version": 2, "accepts": [{"scheme": "exact", "amount": "1000"}]}}},
  {"op": "call_tool", "name": "error_result", "arguments": {"structured": {"accepts": [{"scheme": "exact"}]}, "meta": {"k": "v"}}},
  {"op": "call_tool_cancel", "name": "slow", "arguments": {"seconds": 5}, "after_ms": 300},
  {"op": "call_tool", "name": "echo", "arguments": {"text": "after the cancel"}},
  {"op": "list_resources"},
  {"op": "read_resource", "uri": "selftest://hello"},
  {"op": "get_prompt", "name": "greet", "arguments": {"name": "Ada"}},
  {"op": "no_such_op"},
  {"op": "list_prompts"}
]
EOF

# run NAME ENV... -- CLIENT-ARGS...: runs one client, stdout to $work/NAME.json; prints its exit code.
run() {
  local name=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local rc=0
  env "${envs[@]}" "$@" >"$work/$name.json" 2>"$work/$name.err" || rc=$?
  echo "$rc"
}

# checks FILE CLIENT-PREFIX PROTOCOL-VERSION: the full step list's output, op by op.
checks() {
  "$py" - "$@" <<'EOF'
import json, sys
path, prefix, version = sys.argv[1:4]
try:
    out = json.load(open(path))
except Exception as e:
    print(f"not ok output is one JSON object: {e}"); sys.exit()
steps = out.get("steps", [])
def step(i):
    return steps[i] if i < len(steps) else {}
def ok(name, cond):
    print(("ok " if cond else "not ok ") + name)
ok("one JSON object with client, steps, elicitations", out.get("client", "").startswith(prefix + "@") and len(steps) == 14 and "connectError" not in out)
info = step(0).get("result", {})
ok(f"info: serverInfo, capabilities, protocolVersion {version}", info.get("serverInfo", {}).get("name") == "selftest-server" and "tools" in info.get("capabilities", {}) and info.get("protocolVersion") == version)
tools = {t.get("name"): t for t in step(1).get("result", [])}
ok("list_tools: the tools, echo's _meta kept", {"echo", "count", "confirm_action", "slow", "fail_with", "error_result"} <= set(tools) and tools["echo"].get("_meta") == {"selftest/tool-meta": {"kind": "echo"}})
r = step(2).get("result", {})
ok("call_tool: request _meta reaches the server, result _meta and structuredContent kept", r.get("structuredContent", {}).get("receivedMeta", {}).get("x402/payment") == {"payload": "opaque", "n": 1} and r.get("_meta", {}).get("selftest/result-meta") == {"echoed": True} and r.get("content") == [{"type": "text", "text": "hi"}])
s = step(3)
ok("call_tool with progress: 3 notifications recorded", s.get("progress") == [{"progress": i, "total": 3, "message": f"step {i} of 3"} for i in (1, 2, 3)] and s.get("result", {}).get("structuredContent") == {"result": "counted to 3"})
els = out.get("elicitations", [])
ok("elicitation accepted with confirm=true and recorded", step(4).get("result", {}).get("structuredContent") == {"result": "accept: confirm=True"} and len(els) == 1 and els[0].get("message") == "Do you confirm the action?" and els[0].get("requestedSchema", {}).get("properties", {}).get("confirm", {}).get("type") == "boolean" and els[0].get("response") == {"action": "accept", "content": {"confirm": True}})
ok("JSON-RPC error -32402 with data reaches the caller intact", step(5).get("error") == {"code": -32402, "message": "Payment required", "data": {"x402Version": 2, "accepts": [{"scheme": "exact", "amount": "1000"}]}} and "result" not in step(5))
r = step(6).get("result", {})
ok("isError result keeps structuredContent and _meta", r.get("isError") is True and r.get("structuredContent") == {"accepts": [{"scheme": "exact"}]} and r.get("_meta", {}).get("k") == "v")
ok("call_tool_cancel: cancelled", step(7).get("outcome") == "cancelled" and step(7).get("after_ms") == 300)
ok("the connection works after the cancel", step(8).get("result", {}).get("structuredContent", {}).get("text") == "after the cancel")
ok("list_resources", [x.get("uri") for x in step(9).get("result", [])] == ["selftest://hello"])
ok("read_resource", step(10).get("result", {}).get("contents", [{}])[0].get("text") == "hello from the selftest server")
ok("get_prompt", step(11).get("result", {}).get("messages", [{}])[0].get("content", {}).get("text") == "Please greet Ada.")
ok("a failed step is recorded and the next one runs", "error" in step(12) and [p.get("name") for p in step(13).get("result", [])] == ["greet"])
EOF
}

# record NAME < checks-output: counts the checker's lines.
record() {
  local name=$1 line
  while IFS= read -r line; do
    case $line in
      "ok "*) check "$name: ${line#ok }" 0 ;;
      "not ok "*) check "$name: ${line#not ok }" 1 ;;
    esac
  done
}

ts=(node client.mjs)
pyc=("$py" client.py)
for transport in stdio http; do
  if [[ $transport == stdio ]]; then target=(--stdio "$py" selftest_server.py); else target=(--url "$url"); fi
  for client in ts py py-legacy; do
    name="$client-$transport"
    case $client in
      ts) cmd=("${ts[@]}"); prefix=typescript-sdk; version=2025-11-25; envs=() ;;
      py) cmd=("${pyc[@]}"); prefix=python-mcp; version=2026-07-28; envs=() ;;
      py-legacy) cmd=("${pyc[@]}"); prefix=python-mcp; version=2025-11-25; envs=(MCP_PY_MODE=legacy) ;;
    esac
    t=$(date +%s%N)
    rc=$(run "$name" ELICIT=accept "${envs[@]}" -- "${cmd[@]}" --steps "$work/steps.json" "${target[@]}")
    log "$name: exit $rc in $(( ($(date +%s%N) - t) / 1000000 )) ms"
    [[ $rc == 0 ]]; check "$name: exit 0" $?
    record "$name" < <(checks "$work/$name.json" "$prefix" "$version")
  done
  # Same steps, same server, same protocol version: the two SDKs print the same steps.
  "$py" - "$work/ts-$transport.json" "$work/py-legacy-$transport.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
diff = [i for i, (x, y) in enumerate(zip(a["steps"], b["steps"])) if x != y]
if diff or len(a["steps"]) != len(b["steps"]):
    print("steps differ at", diff, file=sys.stderr); sys.exit(1)
EOF
  check "$transport: TypeScript and Python (2025-11-25) print the same steps" $?
done

# --- elicitation modes ---------------------------------------------------------------------------
steps='[{"op":"call_tool","name":"confirm_action","arguments":{}},{"op":"call_tool","name":"echo","arguments":{"text":"x"}}]'
for client in ts py; do
  if [[ $client == ts ]]; then cmd=("${ts[@]}"); else cmd=("${pyc[@]}"); fi
  for mode in decline none; do
    for transport in stdio http; do
      if [[ $transport == stdio ]]; then target=(--stdio "$py" selftest_server.py); else target=(--url "$url"); fi
      name="$client-elicit-$mode-$transport"
      rc=$(run "$name" ELICIT=$mode "MCP_STEPS=$steps" -- "${cmd[@]}" "${target[@]}")
      "$py" - "$work/$name.json" "$mode" "$rc" <<'EOF'
import json, sys
out = json.load(open(sys.argv[1])); mode = sys.argv[2]
s0, s1 = out["steps"]
assert sys.argv[3] == "0", "exit code"
assert s1["result"]["structuredContent"]["text"] == "x", "the next step runs"
if mode == "decline":
    assert s0["result"]["structuredContent"] == {"result": "decline"}, s0
    assert [e["response"] for e in out["elicitations"]] == [{"action": "decline"}], out["elicitations"]
else:  # no elicitation capability declared: this server refuses the tool with -32021
    assert s0["error"]["code"] == -32021 and s0["error"]["data"] == {"requiredCapabilities": {"elicitation": {"form": {}}}}, s0
    assert out["elicitations"] == [], out["elicitations"]
EOF
      check "$name" $?
    done
  done
done

# --- a refused connection -------------------------------------------------------------------------
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
for client in ts py; do
  if [[ $client == ts ]]; then cmd=("${ts[@]}"); else cmd=("${pyc[@]}"); fi
  rc=$(run "$client-refused" 'MCP_STEPS=[{"op":"info"}]' -- "${cmd[@]}" --url "http://127.0.0.1:$port/mcp")
  [[ $rc == 1 ]] && "$py" -c 'import json,sys; o=json.load(open(sys.argv[1])); assert "connectError" in o and o["steps"] == []' "$work/$client-refused.json"
  check "$client: a refused connection exits 1 with connectError" $?
done

echo "selftest: $passed passed, $failed failed"
(( failed == 0 ))
