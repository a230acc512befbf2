"""quarry-console's HTTP server: the standard library's threading server, the JSON layer
(api.py) under /api/, the static pages (static/) for every view's path, /healthz.

Every view is one page (static/index.html) whose script reads the view and its query from the
URL (/search?q=…, /browse?topic=…&begin=…, /message?topic=…&broker=…, /cluster), so a link
pasted elsewhere shows the same answer. Stops cleanly on SIGTERM/SIGINT.

An operator who logs in (POST /api/login, JSON) gets a session cookie and every /api/ call of
that browser is signed with their account (sessions.py); without one, calls are signed with
the process's own account (QUARRY_ACCESS_KEY), if any. With a certificate and key the console
serves HTTPS only, its cookie marked Secure.
"""
from __future__ import annotations

import ipaddress
import json
import logging
import mimetypes
import signal
import socket
import ssl
import sys
import threading
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

from quarry.channels import signs_calls
from quarry.clients.admin import AdminClient
from quarry.clients.console import dead_letters
from quarry.clients.console.api import Api, Response
from quarry.clients.console.sessions import COOKIE, Session, Sessions
from quarry.formats.addresses import format_host_port, split_host_port
from quarry.services.log import configure_logging, log_event

log = logging.getLogger("quarry.console")

VIEWS = ("/", "/search", "/browse", "/message", "/cluster", "/login")
LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
MAX_POST_BYTES = 16 * 1024
STATIC = resources.files("quarry.clients.console") / "static"


def host_name(header: str) -> str:
    """The name of a Host header (`name`, `name:port`, `[v6]:port`), lower-case, without a
    trailing dot."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1:].split("]", 1)[0]
    elif h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def names_of(bind_host: str, public_names: str = "") -> frozenset[str]:
    """The Host names the console answers: the bind host (unless a wildcard), localhost's names,
    and `public_names` (comma-separated: what operators type, e.g. behind a proxy). An IP
    address is always accepted (host_allowed): DNS rebinding needs a name."""
    names = {host_name(n) for n in public_names.split(",") if n.strip()} | set(LOCAL_NAMES)
    if bind_host not in ("", "0.0.0.0", "::"):
        names.add(host_name(f"[{bind_host}]" if ":" in bind_host else bind_host))
    return frozenset(names)


def host_allowed(header: str | None, names: frozenset[str]) -> bool:
    if header is None:  # no Host at all: not a browser (every browser sends one), so no rebinding
        return True
    name = host_name(header)
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return name in names


def _static(name: str) -> bytes | None:
    if not name or "/" in name or name.startswith("."):
        return None
    f = STATIC / name
    return f.read_bytes() if f.is_file() else None


class Handler(BaseHTTPRequestHandler):
    server_version = "quarry-console"
    timeout = 60  # a connection that sends nothing (or never finishes its TLS handshake) ends
    api: Api  # set on the class made by make_server
    sessions: Sessions
    secure: bool
    names: frozenset[str]  # the Host names this console answers (names_of)
    resend_needs_login: bool  # no account of its own: a resend is signed by the operator who logged in

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

    MAX_POST_BYTES = 1 << 20

    def _misdirected(self, path: str) -> bool:
        """Refuse (421) a request whose Host is a name this console does not have: a page of
        another site whose name was rebound to this address (DNS rebinding) sends its own name.
        /healthz answers any Host (a probe may use a container's name; it says only "ok")."""
        host = self.headers.get("Host")
        if path == "/healthz" or host_allowed(host, self.names):
            return False
        log_event(log, "misdirected request", logging.WARNING, client=self.client_address[0], host=host, path=path)
        self._reply(Response(421, {"error": f"Host {host!r} is not a name of this console: open it by its address, localhost, "
                                            "or a name given with --public-name (QUARRY_CONSOLE_PUBLIC_NAME)", "field": "Host"}))
        return True

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._misdirected(path):
            return
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != self.headers.get("Host", ""):  # another site's page posting here
            self._reply(Response(403, {"error": f"Origin {origin} is not this console"}))
            return
        if path in ("/api/login", "/api/logout"):
            self._access(path)
            return
        session, ended = self._session()
        if ended:
            self._reply(self._ended())
            return
        if path == "/api/resend" and session is None and self.resend_needs_login:
            self._reply(Response(401, {"error": "log in to resend: this console has no account of its own (QUARRY_ACCESS_KEY), "
                                                "so a resend is sent as the operator who logged in", "code": "LOGIN_REQUIRED"}))
            return
        length = self._length(self.MAX_POST_BYTES)
        if length is None:
            return
        body = self.rfile.read(length)
        try:
            response = (session.api if session is not None else self.api).handle_post(path, body, self.headers.get("Content-Type", ""))
        except Exception as exc:  # a bug, not an answer: say so once, keep serving
            log_event(log, "request failed", logging.ERROR, path=path, error=repr(exc))
            response = Response(500, {"error": f"console error: {exc!r}"})
        log_event(log, "api", logging.INFO, path=path, method="POST", status=response.status)
        self._reply(response)

    def _session(self) -> tuple[Session | None, str]:
        """The browser's session, and the cookie's value when it names one that ended (every
        request that asks ends the sessions idle too long)."""
        self.sessions.sweep()
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
        except CookieError:
            return None, ""
        if morsel is None or not morsel.value:
            return None, ""
        session = self.sessions.get(morsel.value)
        return session, "" if session is not None else morsel.value

    def _cookie(self, value: str, max_age: int | None = None) -> str:
        return (f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict" + (f"; Max-Age={max_age}" if max_age is not None else "")
                + ("; Secure" if self.secure else ""))

    def _length(self, limit: int) -> int | None:
        """The request's Content-Length (none: 0), else None once the refusal is sent: 400
        naming the header when it is no byte count, 413 when it is over `limit`."""
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not raw.isdigit():  # not int(): it takes "+5", " 5", "5_0" and "-1"
            self._reply(Response(400, {"error": f"Content-Length: must be a byte count, got {raw[:40]!r}", "field": "Content-Length"}))
            return None
        if int(raw) > limit:
            self._reply(Response(413, {"error": f"Content-Length: at most {limit} bytes, got {raw}", "field": "Content-Length"}))
            return None
        return int(raw)

    def _ended(self) -> Response:
        return Response(401, {"error": "your console session ended (logged out, idle too long, or the console restarted): log in again",
                              "code": "SESSION_ENDED"}, {"Set-Cookie": self._cookie("", 0)})

    def _access(self, path: str) -> None:
        """/api/login and /api/logout: JSON from the console's own page only (a form of another
        site can send neither JSON nor this origin; the cookie is SameSite=Strict too)."""
        if self.headers.get_content_type() != "application/json":
            self._reply(Response(415, {"error": "Content-Type: must be application/json"}))
            return
        length = self._length(MAX_POST_BYTES)
        if length is None:
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._reply(Response(400, {"error": "the body must be a JSON object", "field": ""}))
            return
        if path == "/api/logout":
            try:
                cookie = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
            except CookieError:
                cookie = None
            if cookie is not None:
                self.sessions.logout(cookie.value)
            self._reply(Response(200, {"loggedIn": False}, {"Set-Cookie": self._cookie("", 0)}))
            return
        try:
            response, sid = self.sessions.login(body)
        except Exception as exc:  # a bug, not an answer (the session's channels are closed): say so once, keep serving
            log_event(log, "request failed", logging.ERROR, path=path, error=repr(exc))
            response, sid = Response(500, {"error": f"console error: {exc!r}"}), None
        if sid is not None:
            response.headers["Set-Cookie"] = self._cookie(sid)
        log_event(log, "login", logging.INFO if sid else logging.WARNING, client=self.client_address[0],
                  access_key=body.get("accessKey") if isinstance(body.get("accessKey"), str) else "-", status=response.status)
        self._reply(response)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if self._misdirected(path):
            return
        if path == "/api/session":
            session, ended = self._session()
            body = {"loggedIn": session is not None, "accessKey": session.access_key if session else "", "sessionEnded": bool(ended),
                    "https": self.secure, "processAccount": signs_calls()}
            self._reply(Response(200, body, {"Set-Cookie": self._cookie("", 0)} if ended else {}))
            return
        if path.startswith("/api/"):
            params = dict(parse_qsl(url.query, keep_blank_values=True))
            session, ended = self._session()
            if ended and path != "/api/info":
                self._reply(self._ended())
                return
            api = session.api if session is not None else self.api
            try:
                response = api.handle(path, params)
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
            page = _static("index.html")
            assert page is not None
            self._send(200, page, "text/html; charset=utf-8")
            return
        if path.startswith("/static/"):
            data = _static(path[len("/static/"):])
            if data is not None:
                kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
                self._send(200, data, kind + ("; charset=utf-8" if kind.startswith("text/") or kind.endswith("javascript") else ""))
                return
        self._send(404, b"not found\n", "text/plain; charset=utf-8")


def _connection_failed(server: Any, request: Any, client_address: Any) -> None:
    """A connection that broke (a client speaking plain HTTP to the HTTPS port, a failed
    handshake, a reset): one event, not a traceback on stderr."""
    log_event(log, "connection failed", logging.DEBUG, client=client_address[0], error=repr(sys.exc_info()[1]))


def make_server(bind: str, admin: Any, histogram_slice_s: float = 1.5, tls: ssl.SSLContext | None = None,
                session_idle_s: float = 3600, make_admin: Callable[[tuple[str, str]], Any] | None = None,
                public_names: str = "", resend_needs_login: bool | None = None) -> ThreadingHTTPServer:
    """`make_admin(account)`: the client of a logged-in operator (by default an AdminClient of
    the same routers signing with that account). `public_names`: Host names answered besides
    the bind host and localhost's (names_of). `resend_needs_login`: POST /api/resend only from
    a logged-in session (default: when the process has no account of its own)."""
    host, port = split_host_port(bind)
    if make_admin is None:
        def make_admin(account: tuple[str, str]) -> Any:
            return AdminClient(admin.router_addr, timeout_s=admin.timeout_s, account=account)
    new_admin = make_admin
    resent = dead_letters.Resent()  # one record for the process's Api and every session's: a dead letter is resent once
    sessions = Sessions(lambda account: Api(new_admin(account), histogram_slice_s=histogram_slice_s, resent=resent), session_idle_s)
    handler = type("ConsoleHandler", (Handler,), {"api": Api(admin, histogram_slice_s=histogram_slice_s, resent=resent), "sessions": sessions,
                                                  "secure": tls is not None, "names": names_of(host, public_names),
                                                  "resend_needs_login": not signs_calls() if resend_needs_login is None else resend_needs_login})
    server_class = type("ConsoleServer", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET,
                                                                  "handle_error": _connection_failed})
    server = server_class((host, port), handler)
    server.daemon_threads = True
    if tls is not None:
        # The handshake runs on the connection's own thread (its first read), not in accept().
        server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """The console's HTTPS context; OSError/ssl.SSLError when the files cannot be used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def serve(args: Any) -> int:
    configure_logging(args.log_format, args.log_level)
    from quarry.services.settings import cannot_listen, named

    tls = None
    if args.tls_cert:
        try:
            tls = tls_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            err = f"{named('--tls-cert')} / {named('--tls-key')}: cannot serve HTTPS with {args.tls_cert} and {args.tls_key}: {exc}"
            log_event(log, "refusing to start", logging.CRITICAL, reason=err)
            return 2
    admin = AdminClient(args.router, timeout_s=args.timeout_ms / 1000)
    try:
        server = make_server(args.bind, admin, args.histogram_slice_ms / 1000, tls, args.session_idle_minutes * 60, public_names=args.public_name)
    except OSError as exc:
        refusal = cannot_listen("--bind", args.bind, exc.strerror or str(exc))
        log_event(log, "refusing to start", logging.CRITICAL, reason=str(refusal))
        return 2
    host, port = server.server_address[:2]
    address = format_host_port(str(host), port)
    log_event(log, "console listening", url=f"{'https' if tls else 'http'}://{address}/", routers=args.router)
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
        server.RequestHandlerClass.sessions.close()  # type: ignore[attr-defined]
        server.RequestHandlerClass.api.close()  # type: ignore[attr-defined]  # the process's admin, and its resend producer if one was made
        log_event(log, "console stopped")
    return 0
