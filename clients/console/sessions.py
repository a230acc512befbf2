"""Operators logged in to the console: one session per browser, each with its own AdminClient
signing every call to the routers with the account the operator typed.

A session is a random id (the cookie's value, HttpOnly, SameSite=Strict, Secure over HTTPS)
mapped here to the account; the secret key stays in this process, never in a URL, a log line
or an answer. Logging in asks the routers one signed call (ListTopics): UNAUTHENTICATED
refuses the login with the router's words; PERMISSION_DENIED means the account is known but
may not list every topic, which the answer says. A session idle longer than `idle_s` ends.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from quarry.clients.console.api import Api, BadInput, Response, error_response
from quarry.clients.errors import QuarryError

COOKIE = "quarry_console_session"
MAX_KEY_CHARS = 256


@dataclass
class Session:
    access_key: str
    api: Api
    last_used: float


def _credential(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadInput(name, "required (a non-empty string)")
    if len(value) > MAX_KEY_CHARS or not all("!" <= c <= "~" for c in value):  # gRPC metadata: printable ASCII only
        raise BadInput(name, f"at most {MAX_KEY_CHARS} characters, printable ASCII, no spaces")
    return value


class Sessions:
    """`login(body)` → (Response, session id or None); `get(sid)`; `logout(sid)`."""

    def __init__(self, make_api: Callable[[tuple[str, str]], Api], idle_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.make_api = make_api
        self.idle_s = idle_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def login(self, body: dict[str, Any]) -> tuple[Response, str | None]:
        try:
            access_key, secret_key = _credential(body, "accessKey"), _credential(body, "secretKey")
        except BadInput as exc:
            return error_response(exc, ""), None
        api = self.make_api((access_key, secret_key))
        note = ""
        try:
            topics = len(api.admin.topics())
            note = f"the routers accepted this account's signed call ({topics} topics listed)"
        except QuarryError as exc:
            if exc.code != "PERMISSION_DENIED":
                api.close()
                return error_response(exc, api.admin.router_addr), None
            note = f"this account may not list every topic (the router: {exc.message}); pages of the topics it may read work"
        except BaseException:  # anything else: no session, and its channels closed, not leaked
            api.close()
            raise
        sid = secrets.token_urlsafe(32)
        self.sweep()
        with self._lock:
            self._sessions[sid] = Session(access_key, api, self.monotonic())
        return Response(200, {"loggedIn": True, "accessKey": access_key, "note": note}), sid

    def sweep(self) -> None:
        """End every session idle longer than idle_s, closing its channels (the server calls
        this on every request, so an abandoned session's channels do not wait for a login)."""
        now = self.monotonic()
        with self._lock:
            idle = [k for k, s in self._sessions.items() if now - s.last_used > self.idle_s]
            ended = [self._sessions.pop(k) for k in idle]
        for s in ended:
            s.api.close()

    def get(self, sid: str) -> Session | None:
        self.sweep()  # this session too, when it is idle
        with self._lock:
            s = self._sessions.get(sid)
            if s is not None:
                s.last_used = self.monotonic()
            return s

    def logout(self, sid: str) -> None:
        with self._lock:
            s = self._sessions.pop(sid, None)
        if s is not None:
            s.api.close()

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.api.close()
