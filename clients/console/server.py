"""quarry-console's HTTP server: the standard library's threading server, the JSON layer
(api.py) under /api/, the static pages (static/) for every view's path, /healthz.

Every view is one page (static/index.html) whose script reads the view and its query from the
URL (/search?q=…, /browse?topic=…&begin=…, /message?topic=…&broker=…, /cluster), so a link
pasted elsewhere shows the same answer. Stops cleanly on SIGTERM/SIGINT.
"""
from __future__ import annotations

import json
import logging
import mimetypes
import signal
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from quarry.clients.admin import AdminClient
from quarry.clients.console.api import Api, Response
from quarry.formats.addresses import format_host_port, split_host_port
from quarry.services.log import configure_logging, log_event

log = logging.getLogger("quarry.console")

VIEWS = ("/", "/search", "/browse", "/message", "/cluster")
STATIC = resources.files("quarry.clients.console") / "static"


def _static(name: str) -> bytes | None:
    if not name or "/" in name or name.startswith("."):
        return None
    f = STATIC / name
    return f.read_bytes() if f.is_file() else None


class Handler(BaseHTTPRequestHandler):
    server_version = "quarry-console"
    api: Api  # set on the class made by make_server

    def log_message(self, format: str, *args: Any) -> None:  # one event per request, as every Quarry process logs
        log_event(log, "request", logging.DEBUG, client=self.client_address[0], line=format % args)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reply(self, r: Response) -> None:
        if isinstance(r.body, bytes):
            headers = dict(r.headers)
            self._send(r.status, r.body, headers.pop("Content-Type", "application/octet-stream"), headers)
        else:
            self._send(r.status, json.dumps(r.body).encode(), "application/json; charset=utf-8", r.headers)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path.startswith("/api/"):
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            try:
                response = self.api.handle(path, params)
            except Exception as exc:  # a bug, not an answer: say so once, keep serving
                log_event(log, "request failed", logging.ERROR, path=path, error=repr(exc))
                response = Response(500, {"error": f"console error: {exc!r}"})
            log_event(log, "api", logging.DEBUG, path=path, status=response.status)
            self._reply(response)
            return
        if path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
            return
        if path in VIEWS:
            body = _static("index.html")
            assert body is not None
            self._send(200, body, "text/html; charset=utf-8")
            return
        if path.startswith("/static/"):
            data = _static(path[len("/static/"):])
            if data is not None:
                kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
                self._send(200, data, kind + ("; charset=utf-8" if kind.startswith("text/") or kind.endswith("javascript") else ""))
                return
        self._send(404, b"not found\n", "text/plain; charset=utf-8")


def make_server(bind: str, admin: Any, histogram_slice_s: float = 1.5) -> ThreadingHTTPServer:
    host, port = split_host_port(bind)
    handler = type("ConsoleHandler", (Handler,), {"api": Api(admin, histogram_slice_s=histogram_slice_s)})
    server_class = type("ConsoleServer", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    server = server_class((host, port), handler)
    server.daemon_threads = True
    return server


def serve(args: Any) -> int:
    configure_logging(args.log_format, args.log_level)
    from quarry.services.settings import cannot_listen

    admin = AdminClient(args.router, timeout_s=args.timeout_ms / 1000)
    try:
        server = make_server(args.bind, admin, args.histogram_slice_ms / 1000)
    except OSError as exc:
        err = cannot_listen("--bind", args.bind, exc.strerror or str(exc))
        log_event(log, "refusing to start", logging.CRITICAL, reason=str(err))
        return 2
    host, port = server.server_address[:2]
    address = format_host_port(str(host), port)
    log_event(log, "console listening", url=f"http://{address}/", routers=args.router)
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        admin.close()
        log_event(log, "console stopped")
    return 0
