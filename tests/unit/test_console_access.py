"""quarry-console's access in process: logging in with an account (the routers asked once,
their refusal shown in their words), the session cookie (HttpOnly, SameSite=Strict, Secure over
HTTPS) and every later call signed with that browser's account, logout and idle expiry, secrets
never in answers or logs, refusals distinct from empty answers, other sites' posts refused, and
the console's own HTTPS."""
from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quarry.clients.console.api import Api
from quarry.clients.console.config import parse_args
from quarry.clients.console.server import host_allowed, make_server, names_of, tls_context
from quarry.clients.console.sessions import COOKIE, Sessions
from quarry.clients.errors import QuarryError
from quarry.clients.model import QueryResult
from quarry.v1 import router_pb2
from tests.e2e.pki import make_pki

SECRET = "s3cret-never-shown"
ACCOUNTS = {"ops": SECRET, "reader": "reader-secret"}  # what the fake routers accept
READABLE = {"ops": {"T", "U"}, "reader": {"T"}}  # topics each may query; "reader" may not list


class FakeRouters:
    """An AdminClient as the routers answer one account (None: unsigned calls)."""

    router_addr = "127.0.0.1:9876"
    timeout_s = 5.0

    def __init__(self, account: tuple[str, str] | None) -> None:
        self.account = account
        self.closed = False

    def _check(self, topic: str = "*") -> None:
        if self.account is None:
            raise QuarryError("UNAUTHENTICATED", "unknown or missing access key")
        key, secret = self.account
        if key not in ACCOUNTS:
            raise QuarryError("UNAUTHENTICATED", "unknown or missing access key")
        if ACCOUNTS[key] != secret:
            raise QuarryError("UNAUTHENTICATED", "bad signature (not made by this key for this method and request)")
        if topic == "*" and key != "ops" or topic != "*" and topic not in READABLE[key]:
            raise QuarryError("PERMISSION_DENIED", f"access key {key} lacks query permission on {topic}")

    def topics(self) -> list[str]:
        self._check()
        return ["T", "U"]

    def browse_topic(self, topic: str, *args: Any, **kwargs: Any) -> QueryResult:
        self._check(topic)
        result = QueryResult.from_proto(router_pb2.QueryResult(complete=True))
        result.expired = []
        return result

    def close(self) -> None:
        self.closed = True


class Console:
    def __init__(self, tls: ssl.SSLContext | None = None, client_ctx: ssl.SSLContext | None = None) -> None:
        self.made: list[FakeRouters] = []

        def make_admin(account: tuple[str, str]) -> FakeRouters:
            self.made.append(FakeRouters(account))
            return self.made[-1]

        self.server = make_server("127.0.0.1:0", FakeRouters(None), tls=tls, make_admin=make_admin)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        scheme = "https" if tls else "http"
        self.base = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.ctx = client_ctx

    def request(self, path: str, body: Any = None, cookie: str = "", headers: dict[str, str] | None = None,
                content_type: str = "application/json") -> tuple[int, dict[str, Any], dict[str, str]]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method="POST" if data is not None else "GET")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if cookie:
            req.add_header("Cookie", f"{COOKIE}={cookie}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
                return r.status, json.loads(r.read()), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read()), dict(exc.headers)

    def login(self, key: str, secret: str) -> tuple[int, dict[str, Any], str]:
        status, body, headers = self.request("/api/login", {"accessKey": key, "secretKey": secret})
        cookie = headers.get("Set-Cookie", "")
        sid = cookie.split(";", 1)[0].split("=", 1)[1] if cookie else ""
        return status, body, sid

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console() -> Iterator[Console]:
    c = Console()
    yield c
    c.close()


def test_without_a_login_calls_go_unsigned_and_the_routers_refusal_is_a_401_in_their_words(console: Console) -> None:
    status, body, _ = console.request("/api/topics")
    assert status == 401 and body == {"error": "unknown or missing access key", "code": "UNAUTHENTICATED"}
    status, body, _ = console.request("/api/session")
    assert status == 200 and body["loggedIn"] is False and body["https"] is False


def test_login_sets_a_strict_httponly_cookie_and_later_calls_sign_with_that_account(console: Console, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    status, body, headers = console.request("/api/login", {"accessKey": "ops", "secretKey": SECRET})
    assert status == 200 and body["loggedIn"] and body["accessKey"] == "ops", body
    cookie = headers["Set-Cookie"]
    attrs = [a.strip() for a in cookie.split(";")]
    assert "HttpOnly" in attrs and "SameSite=Strict" in attrs and "Path=/" in attrs and "Secure" not in attrs  # plain HTTP here
    sid = attrs[0].split("=", 1)[1]
    assert len(sid) >= 40 and SECRET not in cookie
    assert console.made[-1].account == ("ops", SECRET)
    status, body, _ = console.request("/api/topics", cookie=sid)
    assert status == 200 and body["topics"] == ["T", "U"]
    status, body, _ = console.request("/api/session", cookie=sid)
    assert body["loggedIn"] and body["accessKey"] == "ops" and SECRET not in json.dumps(body)
    assert all(SECRET not in r.getMessage() for r in caplog.records)  # nor in any log line


def test_a_refused_login_says_the_routers_words_and_sets_no_cookie(console: Console) -> None:
    status, body, headers = console.request("/api/login", {"accessKey": "ops", "secretKey": "wrong"})
    assert status == 401 and "bad signature" in body["error"] and body["code"] == "UNAUTHENTICATED"
    assert "Set-Cookie" not in headers and console.made[-1].closed
    status, body, _ = console.request("/api/login", {"accessKey": "nobody", "secretKey": "x"})
    assert status == 401 and body["error"] == "unknown or missing access key"


@pytest.mark.parametrize("body,field", [({"accessKey": "ops"}, "secretKey"), ({"secretKey": "x"}, "accessKey"),
                                        ({"accessKey": "o ps", "secretKey": "x"}, "accessKey"), ({"accessKey": "ops", "secretKey": 5}, "secretKey"),
                                        ({"accessKey": "opé", "secretKey": "x"}, "accessKey"), ({"accessKey": "ops", "secretKey": "s\x7f"}, "secretKey")])
def test_bad_login_input_is_a_400_naming_the_field(console: Console, body: dict[str, Any], field: str) -> None:
    status, answer, _ = console.request("/api/login", body)
    assert status == 400 and answer["field"] == field, answer
    assert console.made == []  # gRPC metadata is ASCII: a key that cannot be sent never reaches the routers


def test_a_login_whose_call_fails_otherwise_closes_its_channels_and_answers_500() -> None:
    made: list[FakeRouters] = []

    class Broken(FakeRouters):
        def topics(self) -> list[str]:
            raise ValueError("metadata was invalid")  # what grpc raises for a value it cannot send

    def make_api(account: tuple[str, str]) -> Api:
        made.append(Broken(account))
        return Api(made[-1])

    sessions = Sessions(make_api, idle_s=60)
    with pytest.raises(ValueError):
        sessions.login({"accessKey": "ops", "secretKey": SECRET})
    assert made[-1].closed
    c = Console()
    try:
        c.server.RequestHandlerClass.sessions = sessions  # type: ignore[attr-defined]
        status, body, headers = c.request("/api/login", {"accessKey": "ops", "secretKey": SECRET})
        assert status == 500 and "metadata was invalid" in body["error"] and "Set-Cookie" not in headers
        assert len(made) == 2 and made[-1].closed
    finally:
        c.close()


def raw_http(base: str, request: bytes) -> bytes:
    """What the console answers to these exact bytes (the connection read to its end)."""
    host, port = base.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("path", ["/api/resend", "/api/login"])
@pytest.mark.parametrize("length,status", [("abc", 400), ("-1", 400), ("+5", 400), (str(1 << 21), 413)])
def test_a_bad_content_length_is_answered_naming_the_header(console: Console, path: str, length: str, status: int) -> None:
    console.server.RequestHandlerClass.resend_needs_login = False  # type: ignore[attr-defined]  # the length is what is checked here
    host = console.base.split("//", 1)[1]
    out = raw_http(console.base, f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {length}\r\n\r\n{{}}".encode())
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.0 {status} ".encode()), out[:200]
    assert json.loads(body)["field"] == "Content-Length"


def test_an_account_that_may_not_list_topics_logs_in_and_its_refusals_are_403s_not_empty_answers(console: Console) -> None:
    status, body, sid = console.login("reader", "reader-secret")
    assert status == 200 and "may not list every topic" in body["note"] and "lacks query permission on *" in body["note"]
    status, body, _ = console.request("/api/topics", cookie=sid)
    assert status == 403 and body == {"error": "access key reader lacks query permission on *", "code": "PERMISSION_DENIED"}
    status, body, _ = console.request("/api/browse?topic=U&begin=1&end=2", cookie=sid)
    assert status == 403 and body["error"] == "access key reader lacks query permission on U"
    status, body, _ = console.request("/api/browse?topic=T&begin=1&end=2", cookie=sid)
    assert status == 200 and body["messages"] == [] and body["complete"]  # an empty answer is a 200


def test_sessions_are_per_browser(console: Console) -> None:
    _, _, ops = console.login("ops", SECRET)
    _, _, reader = console.login("reader", "reader-secret")
    assert console.request("/api/topics", cookie=ops)[0] == 200
    assert console.request("/api/topics", cookie=reader)[0] == 403
    assert console.request("/api/topics")[0] == 401


def test_logout_ends_the_session_and_its_cookie(console: Console) -> None:
    _, _, sid = console.login("ops", SECRET)
    status, body, headers = console.request("/api/logout", {}, cookie=sid)
    assert status == 200 and body == {"loggedIn": False} and "Max-Age=0" in headers["Set-Cookie"]
    assert console.made[-1].closed
    status, body, headers = console.request("/api/topics", cookie=sid)
    assert status == 401 and body["code"] == "SESSION_ENDED" and "Max-Age=0" in headers["Set-Cookie"]
    status, body, _ = console.request("/api/session", cookie=sid)
    assert body["loggedIn"] is False and body["sessionEnded"] is True


def test_posts_from_another_site_or_not_json_are_refused(console: Console) -> None:
    status, body, _ = console.request("/api/login", {"accessKey": "ops", "secretKey": SECRET}, headers={"Origin": "https://evil.example"})
    assert status == 403 and "evil.example" in body["error"]
    status, body, _ = console.request("/api/login", b"accessKey=ops&secretKey=x", content_type="application/x-www-form-urlencoded")
    assert status == 415 and "application/json" in body["error"]
    assert console.made == []  # the routers were never asked
    status, _, _ = console.request("/api/login", {"accessKey": "ops", "secretKey": SECRET}, headers={"Origin": console.base})
    assert status == 200


def test_a_host_that_is_no_name_of_the_console_is_refused_dns_rebinding() -> None:
    c = Console()
    port = c.server.server_address[1]
    try:
        # a page of evil.example whose name now resolves to 127.0.0.1: its Origin equals its Host
        for path, body in (("/api/session", None), ("/api/login", {"accessKey": "ops", "secretKey": SECRET}), ("/", None)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(c.base + path, data=None if body is None else json.dumps(body).encode(),
                                                              headers={"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}",
                                                                       "Content-Type": "application/json"}), timeout=10)
            assert refused.value.code == 421 and "evil.example" in json.loads(refused.value.read())["error"]
        assert c.made == []  # the routers were never asked
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", "10.1.2.3:8080", "[::1]:80"):  # its address, localhost, any IP
            assert c.request("/api/session", headers={"Host": host})[0] == 200, host
        with urllib.request.urlopen(urllib.request.Request(c.base + "/healthz", headers={"Host": "console:8080"}), timeout=10) as r:
            assert r.status == 200  # a probe by a container's name
    finally:
        c.close()


def test_public_names_are_answered_too() -> None:
    names = names_of("0.0.0.0", "Console.Example.com, ops.internal")
    assert host_allowed("console.example.com:443", names) and host_allowed("ops.internal", names) and host_allowed("localhost:8080", names)
    assert not host_allowed("evil.example", names) and not host_allowed("0.0.0.0.evil.example", names)
    assert host_allowed("my-box:8080", names_of("my-box")) and not host_allowed("my-box", names_of("127.0.0.1"))
    assert parse_args(["--public-name", "console.example.com"]).public_name == "console.example.com"


def test_a_resend_needs_a_login_when_the_console_has_no_account_of_its_own(console: Console) -> None:
    status, body, _ = console.request("/api/resend", {"ids": ["A" * 32]})
    assert status == 401 and body["code"] == "LOGIN_REQUIRED" and "log in" in body["error"]
    _, _, sid = console.login("ops", SECRET)
    status, body, _ = console.request("/api/resend", {"ids": []}, cookie=sid)  # past the gate: the body is checked
    assert status == 400 and body["field"] == "ids"
    signing = Console()
    try:
        signing.server.RequestHandlerClass.resend_needs_login = False  # type: ignore[attr-defined]  # as with QUARRY_ACCESS_KEY set
        status, body, _ = signing.request("/api/resend", {"ids": []})
        assert status == 400 and body["field"] == "ids"
    finally:
        signing.close()


def test_an_idle_session_ends() -> None:
    now = [100.0]
    sessions = Sessions(lambda account: Api(FakeRouters(account)), idle_s=60, monotonic=lambda: now[0])
    response, sid = sessions.login({"accessKey": "ops", "secretKey": SECRET})
    assert response.status == 200 and sid is not None
    now[0] += 59
    session = sessions.get(sid)
    assert session is not None and session.access_key == "ops"
    now[0] += 59  # used 59 s ago: still there
    assert sessions.get(sid) is not None
    admin = session.api.admin
    now[0] += 61
    assert sessions.get(sid) is None and admin.closed


def test_idle_sessions_end_on_any_request_not_only_at_a_login() -> None:
    now = [100.0]
    c = Console()
    try:
        c.server.RequestHandlerClass.sessions.monotonic = lambda: now[0]  # type: ignore[attr-defined]
        _, _, old = c.login("ops", SECRET)
        now[0] += 30
        _, _, fresh = c.login("ops", SECRET)
        abandoned, used = c.made
        now[0] += 3601 - 30  # the first idle past the default hour, the second not
        assert c.request("/api/topics", cookie=fresh)[0] == 200  # another browser's request
        assert abandoned.closed and not used.closed
        now[0] += 3601
        assert c.request("/api/session")[0] == 200  # a request with no cookie at all
        assert used.closed
    finally:
        c.close()


def test_a_producer_is_never_made_after_its_api_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    monkeypatch.setattr("quarry.clients.producer.Producer", lambda *a, **kw: made.append(a) or object())
    api = Api(FakeRouters(("ops", SECRET)))
    api.close()  # the session ended while one of its resends was under way
    with pytest.raises(QuarryError) as refused:
        api.producer()
    assert refused.value.code == "SESSION_ENDED" and made == []


def test_a_session_that_resent_closes_its_producer_with_its_admin_when_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's Api creates its resend producer lazily (signed with the session's account);
    logout, idle expiry and the console's shutdown close it with the AdminClient."""
    made: list[Any] = []

    class RecordingProducer:
        def __init__(self, router_addr: str, timeout_s: float, account: tuple[str, str] | None) -> None:
            self.account, self.closed = account, False
            made.append(self)

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr("quarry.clients.producer.Producer", RecordingProducer)
    now = [100.0]
    sessions = Sessions(lambda account: Api(FakeRouters(account)), idle_s=60, monotonic=lambda: now[0])
    ended = []
    for how in ("logout", "idle", "shutdown", "no resend"):
        _, sid = sessions.login({"accessKey": "ops", "secretKey": SECRET})
        assert sid is not None
        session = sessions.get(sid)
        assert session is not None
        if how != "no resend":
            assert session.api.producer() is session.api.producer()  # one producer per session
        ended.append((how, session.api.admin))
        if how == "logout":
            sessions.logout(sid)
        elif how == "idle":
            now[0] += 61
            assert sessions.get(sid) is None
    sessions.close()
    assert [p.account for p in made] == [("ops", SECRET)] * 3 and all(p.closed for p in made)
    assert all(admin.closed for _, admin in ended)


def test_the_console_serves_https_with_the_given_certificate_and_marks_its_cookie_secure(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"])
    client = ssl.create_default_context(cafile=pki["ca"])
    c = Console(tls_context(pki["server_cert"], pki["server_key"]), client)
    try:
        status, body, _ = c.request("/api/session")
        assert status == 200 and body["https"] is True
        status, _, headers = c.request("/api/login", {"accessKey": "ops", "secretKey": SECRET})
        assert status == 200 and "Secure" in [a.strip() for a in headers["Set-Cookie"].split(";")]
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # not the CA's: refused by the client
            urllib.request.urlopen(c.base + "/healthz", timeout=10, context=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to the HTTPS port gets no page
            urllib.request.urlopen(c.base.replace("https", "http") + "/healthz", timeout=10)
    finally:
        c.close()


def test_tls_cert_and_key_come_together(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert", "/x/cert.pem"])
    assert "--tls-cert [env QUARRY_CONSOLE_TLS_CERT] and --tls-key [env QUARRY_CONSOLE_TLS_KEY]: set both" in capsys.readouterr().err
    monkeypatch.setenv("QUARRY_CONSOLE_TLS_CERT", "/x/cert.pem")
    monkeypatch.setenv("QUARRY_CONSOLE_TLS_KEY", "/x/key.pem")
    args = parse_args([])
    assert (args.tls_cert, args.tls_key) == ("/x/cert.pem", "/x/key.pem")
