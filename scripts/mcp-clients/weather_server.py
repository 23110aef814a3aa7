#!/usr/bin/env python3
"""A payment-unaware MCP server on the official Python SDK (PyPI `mcp`: MCPServer, formerly
FastMCP), for the gateway's end-to-end tests: `stipendex gateway` sells its tools, resource and
prompt; not a line of payment code here.

    weather_server.py                 # stdio
    weather_server.py --http PORT     # Streamable HTTP at http://127.0.0.1:PORT/mcp

Tools: forecast(city) (the gateway prices it), echo(text) (free), fail(message) (an isError
result). Resource reports://daily; prompt brief(topic). Each call of forecast is counted in the
file named by WEATHER_CALLS_FILE (one line per call), so a test can see how often the gateway
forwarded a paid call.
"""

from __future__ import annotations

import argparse
import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

server = MCPServer("weather-server", version="1.0.0", instructions="forecasts, knows nothing of payments")


def _count(what: str) -> None:
    path = os.environ.get("WEATHER_CALLS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(what + "\n")


@server.tool()
async def forecast(city: str) -> str:
    """Tomorrow's forecast for a city."""
    _count(f"forecast {city}")
    return f"sunny in {city}"


@server.tool()
async def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
async def fail(message: str) -> CallToolResult:
    """Answer with a tool error."""
    _count(f"fail {message}")
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


@server.resource("reports://daily", name="daily", mime_type="text/plain")
def daily() -> str:
    """The daily report."""
    _count("report daily")
    return "the daily report: all clear"


@server.prompt()
def brief(topic: str) -> str:
    """A briefing prompt."""
    return f"Brief me on {topic}."


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
