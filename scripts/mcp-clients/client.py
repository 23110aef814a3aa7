#!/usr/bin/env python3
"""A plain MCP host on the official Python SDK (PyPI `mcp`, pinned in requirements.txt).

Same command line and same output as client.mjs (the TypeScript SDK); see README.md.

    client.py [--steps FILE] [--header 'Name: value']... (--url URL | --stdio CMD [ARG...])

Steps come from --steps FILE (a JSON array) or the env var MCP_STEPS (a JSON string). One JSON
object is printed on stdout at the end; logs go to stderr. Exit 0 unless the connection failed.

Env: ELICIT=accept|decline|none (default none: no elicitation capability), MCP_TIMEOUT_MS (per
request, default 60000), MCP_PY_MODE=auto|legacy|2026-07-28 (the SDK's connect mode; default auto,
the SDK's own default: probe server/discover, fall back to initialize).

Run it with the virtualenv's python (install.sh makes it; MCP_CLIENTS_VENV, default
/var/tmp/mcp-clients-venv). Started by another python without `mcp`, it re-executes itself there.
"""

from __future__ import annotations

import json
import os
import sys

VENV = os.environ.get("MCP_CLIENTS_VENV", "/var/tmp/mcp-clients-venv")

try:
    import anyio
    import mcp.types as types
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError
except ImportError:
    venv_python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV) and os.access(venv_python, os.X_OK):
        os.execv(venv_python, [venv_python, os.path.abspath(__file__), *sys.argv[1:]])
    sys.stderr.write(f"client.py: the `mcp` package is missing; run scripts/mcp-clients/install.sh (venv {VENV})\n")
    sys.exit(2)

from contextlib import AsyncExitStack
from importlib.metadata import version as dist_version
from typing import Any

SDK_VERSION = dist_version("mcp")
CLIENT_ID = f"python-mcp@{SDK_VERSION}"


def log(*parts: Any) -> None:
    print("client.py:", *parts, file=sys.stderr, flush=True)


def usage(msg: str) -> None:
    sys.stderr.write(
        f"client.py: {msg}\n"
        "usage: client.py [--steps FILE] [--header 'Name: value']... (--url URL | --stdio CMD [ARG...])\n"
    )
    sys.exit(2)


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"headers": {}, "steps_file": None, "url": None, "stdio": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--stdio":
            opts["stdio"] = argv[i + 1 :]
            if not opts["stdio"]:
                usage("--stdio needs a command")
            break
        if a in ("--url", "--steps", "--header"):
            if i + 1 >= len(argv):
                usage(f"{a} needs a value")
            v = argv[i + 1]
            if a == "--url":
                opts["url"] = v
            elif a == "--steps":
                opts["steps_file"] = v
            else:
                name, sep, value = v.partition(":")
                if not sep:
                    usage("--header takes 'Name: value'")
                opts["headers"][name.strip()] = value.strip()
            i += 2
            continue
        usage(f"unknown argument {a!r}")
    if (opts["url"] is None) == (opts["stdio"] is None):
        usage("give exactly one of --url URL and --stdio CMD [ARG...]")
    return opts


def load_steps(steps_file: str | None) -> list[dict[str, Any]]:
    try:
        if steps_file is not None:
            with open(steps_file, encoding="utf-8") as f:
                steps = json.load(f)
        elif os.environ.get("MCP_STEPS"):
            steps = json.loads(os.environ["MCP_STEPS"])
        else:
            usage("no steps: give --steps FILE or MCP_STEPS")
    except (OSError, ValueError) as e:
        usage(f"cannot read the steps: {e}")
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        usage("the steps must be a JSON array of objects")
    return steps


def canonical(value: Any) -> Any:
    """Sorted keys, and integral floats as integers (JavaScript has one number type: 1.0 is 1)."""
    if isinstance(value, dict):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def dump(model: Any) -> Any:
    """A received SDK model as JSON, with the fields the wire carried (defaults not filled in)."""
    return model.model_dump(by_alias=True, mode="json", exclude_unset=True)


def error_entry(e: BaseException) -> dict[str, Any]:
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    if isinstance(e, MCPError):
        err: dict[str, Any] = {"code": e.code, "message": e.message}
        if e.data is not None:
            err["data"] = e.data
        return err
    return {"message": str(e) or repr(e), "exception": type(e).__name__}


def fill_accept(schema: dict[str, Any] | None) -> dict[str, Any]:
    """Every boolean property true; every required string property "yes" (an enum's first value)."""
    content: dict[str, Any] = {}
    schema = schema or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    for name, prop in props.items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        if kind == "boolean":
            content[name] = True
        elif kind == "string" and name in required:
            enum = prop.get("enum")
            if not enum and isinstance(prop.get("oneOf"), list) and prop["oneOf"]:
                enum = [o.get("const") for o in prop["oneOf"] if isinstance(o, dict)]
            content[name] = enum[0] if enum else "yes"
    return content


async def run(opts: dict[str, Any], steps: list[dict[str, Any]], out: dict[str, Any]) -> int:
    elicit_mode = (os.environ.get("ELICIT") or "none").lower()
    if elicit_mode not in ("accept", "decline", "none"):
        usage("ELICIT must be accept, decline or none")
    timeout_s = float(os.environ.get("MCP_TIMEOUT_MS", "60000")) / 1000.0
    mode = os.environ.get("MCP_PY_MODE") or "auto"
    elicitations: list[dict[str, Any]] = out["elicitations"]

    async def on_elicit(_ctx: Any, params: Any) -> types.ElicitResult:
        p = dump(params)
        entry: dict[str, Any] = {"message": p.get("message")}
        if "requestedSchema" in p:
            entry["requestedSchema"] = p["requestedSchema"]
        if p.get("mode") == "url":
            entry["url"] = p.get("url")
        if elicit_mode == "accept":
            content = fill_accept(p.get("requestedSchema"))
            entry["response"] = {"action": "accept", "content": content}
            elicitations.append(entry)
            log("elicitation: accept", json.dumps(content))
            if p.get("mode") == "url":
                return types.ElicitResult(action="accept")
            return types.ElicitResult(action="accept", content=content)
        entry["response"] = {"action": "decline"}
        elicitations.append(entry)
        log("elicitation: decline")
        return types.ElicitResult(action="decline")

    if opts["stdio"] is not None:
        cmd, *args = opts["stdio"]
        # The whole environment goes to the server (the SDK's default passes only a safe few).
        target: Any = StdioServerParameters(command=cmd, args=args, env=dict(os.environ))
    else:
        target = None  # built inside the exit stack: the HTTP client must be closed

    async with AsyncExitStack() as stack:
        if target is None:
            http = await stack.enter_async_context(create_mcp_http_client(headers=opts["headers"] or None))
            target = streamable_http_client(opts["url"], http_client=http)
        client = Client(
            target,
            mode=mode,
            client_info=types.Implementation(name="python-mcp", version=SDK_VERSION),
            elicitation_callback=on_elicit if elicit_mode != "none" else None,
            read_timeout_seconds=timeout_s,
            cache=None,  # a harness: every list goes to the server
        )
        try:
            await stack.enter_async_context(client)
        except Exception as e:  # noqa: BLE001 - the connection itself failed
            log("connection failed:", repr(e))
            out["connectError"] = error_entry(e)
            return 1
        out["connected"] = True
        log("connected:", client.protocol_version)

        for step in steps:
            op = step.get("op")
            entry: dict[str, Any] = {"op": op}
            out["steps"].append(entry)
            try:
                await run_step(client, step, entry, timeout_s)
            except Exception as e:  # noqa: BLE001 - a failed step is recorded; the next one runs
                entry["error"] = error_entry(e)
                log(f"step {op}: error", json.dumps(entry["error"]))
    return 0


async def run_step(client: Client, step: dict[str, Any], entry: dict[str, Any], timeout_s: float) -> None:
    op = step.get("op")
    if op == "info":
        session = client.session
        if session.initialize_result is not None:
            entry["result"] = dump(session.initialize_result)
        else:
            discover = session.discover_result
            info: dict[str, Any] = {
                "protocolVersion": client.protocol_version,
                "capabilities": dump(client.server_capabilities),
            }
            if client.server_info is not None:
                info["serverInfo"] = dump(client.server_info)
            if client.instructions is not None:
                info["instructions"] = client.instructions
            if discover is not None:
                d = dump(discover)
                info["supportedVersions"] = d.get("supportedVersions")
                if "_meta" in d:
                    info["_meta"] = d["_meta"]
            entry["result"] = info
    elif op == "list_tools":
        entry["result"] = dump(await client.list_tools())["tools"]
    elif op == "list_resources":
        entry["result"] = dump(await client.list_resources())["resources"]
    elif op == "list_prompts":
        entry["result"] = dump(await client.list_prompts())["prompts"]
    elif op == "read_resource":
        entry["result"] = dump(await client.read_resource(step["uri"]))
    elif op == "get_prompt":
        entry["result"] = dump(await client.get_prompt(step["name"], step.get("arguments")))
    elif op == "call_tool":
        progress: list[dict[str, Any]] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            n: dict[str, Any] = {"progress": p}
            if total is not None:
                n["total"] = total
            if message is not None:
                n["message"] = message
            progress.append(n)

        if step.get("progress"):
            entry["progress"] = progress
        result = await client.call_tool(
            step["name"],
            step.get("arguments") or {},
            progress_callback=on_progress if step.get("progress") else None,
            meta=step.get("meta"),
        )
        entry["result"] = dump(result)
    elif op == "call_tool_cancel":
        after_ms = float(step.get("after_ms", 0))
        entry["after_ms"] = step.get("after_ms", 0)
        # Cancelling the caller's scope is how this SDK cancels: its dispatcher then sends
        # notifications/cancelled for the request.
        with anyio.move_on_after(after_ms / 1000.0) as scope:
            result = await client.call_tool(step["name"], step.get("arguments") or {}, meta=step.get("meta"))
        if scope.cancelled_caught:
            entry["outcome"] = "cancelled"
        else:
            entry["outcome"] = "completed"
            entry["result"] = dump(result)
    else:
        raise ValueError(f"unknown op {op!r}")


def main() -> int:
    opts = parse_args(sys.argv[1:])
    steps = load_steps(opts["steps_file"])
    out: dict[str, Any] = {"client": CLIENT_ID, "steps": [], "elicitations": []}
    try:
        code = anyio.run(run, opts, steps, out)
    except Exception as e:  # noqa: BLE001 - e.g. the transport failing, or failing on close
        log("failed:", repr(e))
        if out.get("connected"):
            out["closeError"] = error_entry(e)  # the steps ran; the connection broke or closed badly
            code = 0
        else:
            out["connectError"] = error_entry(e)
            code = 1
    out.pop("connected", None)
    sys.stdout.write(json.dumps(canonical(out), ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
