"""An API that knows nothing of payments, on Python's stdlib WSGI server (wsgiref), for the
gateway's path-spelling tests (`stipendex-cli/tests/gateway.rs`).

It routes on PATH_INFO as PEP 3333 gives it: percent-decoded, so `/api%2Fforecast%2Fparis` is
`/api/forecast/paris` here, as it is to Flask, Django and every WSGI framework. With `--lenient`
it also routes as Express and ASP.NET do by default and as Tomcat treats path parameters:
without regard to case, with an optional trailing slash, `;params` dropped from each segment
and a backslash taken for a slash.

It also serves `/api/big/<n>`: n MiB of `x` (a paid answer larger than what is kept in
memory).

Usage: python3 wsgi_upstream.py [--lenient] [--port N]; prints `listening PORT` once it accepts.
"""

import json
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

LENIENT = "--lenient" in sys.argv


def route(path):
    if LENIENT:
        path = path.replace("\\", "/")
        path = "/".join(seg.split(";", 1)[0] for seg in path.split("/"))
        path = path.lower()
        if len(path) > 1 and path.endswith("/"):
            path = path[:-1]
    parts = path.split("/")
    if path == "/free":
        return 200, {"free": True}
    if len(parts) == 4 and parts[:3] == ["", "api", "forecast"] and parts[3]:
        return 200, {"city": parts[3], "forecast": "PRICED CONTENT"}
    if len(parts) == 4 and parts[:3] == ["", "api", "big"] and parts[3].isdigit():
        return 200, b"x" * (int(parts[3]) * 1024 * 1024)
    return 404, {"error": "not found", "path": path}


def app(environ, start_response):
    status, body = route(environ.get("PATH_INFO", ""))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    reason = {200: "OK", 404: "Not Found"}[status]
    start_response(
        f"{status} {reason}",
        [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
    )
    return [data]


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 0
    server = make_server("127.0.0.1", port, app, handler_class=Quiet)
    print(f"listening {server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
