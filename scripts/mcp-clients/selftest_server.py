#!/usr/bin/env python3
"""A small MCP server (the official Python SDK's MCPServer, formerly FastMCP) for the selftest of
client.mjs and client.py. It knows nothing of payments either: it only gives each thing the clients
must carry through something to carry.

    selftest_server.py                 # stdio
    selftest_server.py --http PORT     # Streamable HTTP at http://127.0.0.1:PORT/mcp

Tools: echo (text, echoes the request's _meta; the tool carries _meta in tools/list), count
(progress notifications), confirm_action (elicits a boolean `confirm`), slow (sleeps, for
cancellation), fail_with (answers with a JSON-RPC error of the given code, message and data),
error_result (answers isError with the given structuredContent and _meta).
Resource selftest://hello; prompt greet(name).
"""

from __future__ import annotations

import argparse
import sys
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    Elicit,
    ElicitationResult,
    MCPServer,
    Resolve,
)
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel, Field

server = MCPServer("selftest-server", version="1.0.0", instructions="selftest server for the MCP client harness")


@server.tool(meta={"selftest/tool-meta": {"kind": "echo"}})
async def echo(text: str, ctx: Context) -> CallToolResult:
    """Echo the text back, with the request's _meta in structuredContent."""
    meta = ctx.request_context.meta
    received = dict(meta) if meta else {}
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content={"text": text, "receivedMeta": received},
        _meta={"selftest/result-meta": {"echoed": True}},
    )


@server.tool()
async def count(ctx: Context, n: int = 3) -> str:
    """Send n progress notifications, then answer."""
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i} of {n}")
        await anyio.sleep(0.05)
    return f"counted to {n}"


class Confirm(BaseModel):
    confirm: bool = Field(description="Go ahead?")


def ask_confirm() -> Elicit[Confirm]:
    return Elicit("Do you confirm the action?", Confirm)


@server.tool()
async def confirm_action(answer: Annotated[ElicitationResult[Confirm], Resolve(ask_confirm)]) -> str:
    """Ask the user to confirm (elicitation) and say what they answered."""
    if isinstance(answer, AcceptedElicitation):
        return f"accept: confirm={answer.data.confirm}"
    return answer.action


@server.tool()
async def slow(seconds: float = 5.0) -> str:
    """Sleep, then answer (for cancellation)."""
    await anyio.sleep(seconds)
    return f"slept {seconds}s"


@server.tool()
async def fail_with(code: int, message: str, data: Any = None) -> str:
    """Answer with a JSON-RPC error of the given code, message and data."""
    raise MCPError(code, message, data)


@server.tool()
async def error_result(structured: dict[str, Any], meta: dict[str, Any] | None = None) -> CallToolResult:
    """Answer a result with isError, the given structuredContent and _meta."""
    return CallToolResult(
        content=[TextContent(type="text", text="tool failed")],
        structured_content=structured,
        is_error=True,
        _meta=meta,
    )


@server.resource("selftest://hello", name="hello", mime_type="text/plain")
def hello() -> str:
    """A static text resource."""
    return "hello from the selftest server"


@server.prompt()
def greet(name: str) -> str:
    """A greeting prompt."""
    return f"Please greet {name}."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP on 127.0.0.1:PORT/mcp")
    args = ap.parse_args()
    if args.http is not None:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run("stdio")


if __name__ == "__main__":
    sys.exit(main())
