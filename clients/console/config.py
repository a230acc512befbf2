"""Settings of quarry-console (flags, else environment, else defaults: services/settings.py's rule)."""
from __future__ import annotations

import argparse

from quarry.formats.addresses import parse_router_addresses, split_host_port
from quarry.services.settings import EnvArgumentParser

DESCRIPTION = (
    "Quarry Console: a web console over the routers' public gRPC API (search by id or key, topic browse, "
    "message pages). TLS and ACL to the routers as every Quarry client: QUARRY_TLS_CA (set: TLS), "
    "QUARRY_TLS_CLIENT_CERT/QUARRY_TLS_CLIENT_KEY (mutual TLS), QUARRY_TLS_SERVER_NAME, "
    "QUARRY_ACCESS_KEY/QUARRY_SECRET_KEY (calls signed with that account until an operator logs in with their own)."
)


def _routers(text: str) -> str:
    parse_router_addresses(text)  # ValueError names what is wrong
    return text


def _bind(text: str) -> str:
    split_host_port(text)
    return text


def build_parser() -> EnvArgumentParser:
    p = EnvArgumentParser(prog="quarry-console", description=DESCRIPTION)
    p.add_setting("--bind", "QUARRY_CONSOLE_BIND", "127.0.0.1:8080", "host:port the console's HTTP server listens on (port 0: any free port, logged)", _bind)
    p.add_setting("--public-name", "QUARRY_CONSOLE_PUBLIC_NAME", "",
                  "host name(s) operators open the console by, comma-separated (e.g. behind a proxy); besides the --bind host, "
                  "localhost and any IP address, a request naming another Host is refused (421: DNS rebinding)")
    p.add_setting("--router", "QUARRY_CONSOLE_ROUTER", "127.0.0.1:9876", "router(s) to ask, host:port; several as 'a:9876;b:9876' (tried in turn)", _routers)
    p.add_setting("--timeout-ms", "QUARRY_CONSOLE_TIMEOUT_MS", 10_000, "deadline of one call to a router", int, minimum=1)
    p.add_setting("--histogram-slice-ms", "QUARRY_CONSOLE_HISTOGRAM_SLICE_MS", 1500,
                  "longest time one histogram request counts before it answers with what it counted so far and a token to go on", int, minimum=1)
    p.add_setting("--tls-cert", "QUARRY_CONSOLE_TLS_CERT", "", "PEM certificate (chain) the console serves HTTPS with; with --tls-key (neither: plain HTTP)")
    p.add_setting("--tls-key", "QUARRY_CONSOLE_TLS_KEY", "", "PEM private key of --tls-cert")
    p.add_setting("--session-idle-minutes", "QUARRY_CONSOLE_SESSION_IDLE_MINUTES", 60,
                  "a logged-in operator's session ends after this long without a request", int, minimum=1)
    p.add_setting("--log-format", "QUARRY_LOG_FORMAT", "kv", "log line format: kv (key=value) or json", str.lower, ["kv", "json"])
    p.add_setting("--log-level", "QUARRY_LOG_LEVEL", "INFO", "log level", str.upper, ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        p.error("--tls-cert [env QUARRY_CONSOLE_TLS_CERT] and --tls-key [env QUARRY_CONSOLE_TLS_KEY]: set both (certificate and key) or neither")
    return args
