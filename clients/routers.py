"""Several routers, as RocketMQ clients know several NameServers: `-n 'a:9876;b:9876'`.

`parse_router_addresses` reads the list (RocketMQ's namesrvAddr form: `;`-separated
host:port, IPv6 hosts in brackets). `RouterPool` calls the first router that answers: a
router that cannot be reached (transport failure) is skipped and the next is tried, and the
one that answered is asked first next time. Any status a router sent is its answer and is
returned as is. Used by the admin client, the producer and the CLI; services that register
with several routers parse their list with the same function.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, TypeVar

import grpc

from quarry.formats.addresses import parse_router_addresses  # noqa: F401 (re-exported: clients import it from here)
from quarry.channels import open_channel
from quarry.transport import transport_failure
from quarry.v1 import router_pb2_grpc

T = TypeVar("T")


class NoRouterAnswered(grpc.RpcError):
    """Every router of the list was unreachable; code()/details() read like any RpcError."""

    def __init__(self, failures: list[tuple[str, grpc.RpcError]]) -> None:
        super().__init__()
        self.failures = failures

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        parts = [f"{addr} ({exc.code().name}: {exc.details()})" for addr, exc in self.failures]  # type: ignore[attr-defined]
        return "no router answered: " + "; ".join(parts)

    def __str__(self) -> str:
        return self.details()


class RouterPool:
    """Channels to every router of a list; `call` fails over when a router cannot be reached."""

    def __init__(self, addresses: str | list[str], options: list[tuple[str, Any]] | None = None, account: tuple[str, str] | None = None) -> None:
        """`account`: (access key, secret key) to sign with instead of the environment's."""
        self.addresses = parse_router_addresses(addresses) if isinstance(addresses, str) else list(addresses)
        self._options = options
        self._account = account
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._preferred = 0

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = open_channel(address, options=self._options, account=self._account)
            return ch

    def call(self, fn: Callable[[router_pb2_grpc.QueryRouterServiceStub], T]) -> T:
        """`fn(stub)` on the preferred router, then on each other one while they are unreachable."""
        n = len(self.addresses)
        start = self._preferred
        failures: list[tuple[str, grpc.RpcError]] = []
        for i in range(n):
            index = (start + i) % n
            address = self.addresses[index]
            try:
                result = fn(router_pb2_grpc.QueryRouterServiceStub(self.channel(address)))
            except grpc.RpcError as exc:
                if not transport_failure(exc) or n == 1:
                    raise
                failures.append((address, exc))
                continue
            self._preferred = index
            return result
        raise NoRouterAnswered(failures)

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()
