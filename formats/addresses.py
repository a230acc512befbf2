"""host:port and RocketMQ's name-server list (`namesrvAddr`: `a:9876;b:9876`), checked once.

Shared by the clients (`-n 'a;b'`: fail over between routers) and the services (`--router
'a;b'`: register with each), as RocketMQ's clients and brokers read one namesrvAddr form.
IPv6 hosts are written in brackets, `[::1]:9876`, and printed one way (`format_host_port`).
"""
from __future__ import annotations

import ipaddress


def split_host_port(text: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` → (host without brackets, port); ValueError when it is not that."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def parse_host_port(text: str, what: str = "address") -> str:
    """Check one `host:port` (`[v6]:port` for IPv6) and return it stripped; ValueError names `what`."""
    addr = text.strip()
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port:
        raise ValueError(f"{what} {addr!r}: expected host:port (IPv6 as [ip]:port)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{what} {addr!r}: an IPv6 host must be in brackets, as [{host}]:{port}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {addr!r}: port must be 1..65535")
    return addr


def parse_router_addresses(text: str, what: str = "router address") -> list[str]:
    """`'a:9876;b:9876'` → `['a:9876', 'b:9876']`; empty items are ignored, repeats dropped;
    ValueError when nothing is left or an item is not host:port."""
    out: list[str] = []
    for item in text.split(";"):
        if item.strip():
            addr = parse_host_port(item, what)
            if addr not in out:
                out.append(addr)
    if not out:
        raise ValueError(f"{what}: empty; expected host:port, several separated by ';'")
    return out


def format_host_port(host: str, port: int | str) -> str:
    """`ip:port`, or `[ip]:port` when the host is an IPv6 address (as URLs and gRPC write it)."""
    host = host.strip().strip("[]")
    if ":" in host:
        try:  # one spelling everywhere: ::1, not 0:0:0:0:0:0:0:1 as Java prints it
            host = ipaddress.IPv6Address(host.split("%")[0]).compressed + (f"%{host.split('%')[1]}" if "%" in host else "")
        except ValueError:
            pass
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def normalize_host_port(text: str) -> str:
    """`::1:10911` → `[::1]:10911`; other forms are returned stripped (unchecked)."""
    host, sep, port = text.strip().rpartition(":")
    return format_host_port(host, port) if sep and host else text.strip()
