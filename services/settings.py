"""Flags that fall back to environment variables, so every setting works in a container.

Each option is `--flag` on the command line, else `$ENV_NAME`, else the default; `--help`
shows all three. A value is checked the same way wherever it came from: one conversion, one
list of choices, one minimum (`Setting.check`), and an error names the flag, its variable
and the rule, so `QUARRY_FLUSH_MODE=sometimes` stops the service exactly as
`--flush-mode sometimes` does.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from quarry.formats.addresses import split_host_port
from quarry.services.event_loop import CHOICES as EVENT_LOOPS


class StartupError(Exception):
    """A setting that cannot be honoured at start (the message is the one line an operator
    sees; the service logs it as `refusing to start` and exits 2)."""


# Every setting this process parsed, by flag: an error found later (a port that cannot be
# bound) names the flag and its variable as a bad value does (`named`).
_PARSED: dict[str, Setting] = {}


def named(flag: str) -> str:
    """`--flag [env VARIABLE]` as every settings error names it (the bare flag when this
    process parsed no such setting, e.g. a server started by a test)."""
    setting = _PARSED.get(flag)
    return f"{flag} [env {setting.env}]" if setting is not None else flag


def cannot_listen(flag: str, address: str, reason: str) -> StartupError:
    """The one line a port that cannot be bound stops a service with (exit 2, no traceback)."""
    return StartupError(f"{named(flag)}: cannot listen on {address}: {reason}")


class _Given(str):
    """A raw value typed on the command line (checked after parsing, like one from the environment)."""


class _StoreGiven(argparse.Action):
    """Stores the flag's raw string marked as given. Only called for flags on the command line
    (argparse would also pass string defaults through a `type`, hiding where a value came from)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, _Given(values))


_RULES = {int: "must be an integer", float: "must be a number"}


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, variable, default, and the rule every raw value must pass."""

    flag: str
    env: str
    dest: str
    default: Any
    help: str
    convert: Callable[[str], Any]
    choices: tuple[str, ...] | None
    minimum: float | None

    def check(self, raw: str) -> Any:
        """Convert and validate one raw string; ValueError says the rule that failed."""
        try:
            value = self.convert(raw)
        except (ValueError, TypeError) as exc:
            rule = _RULES.get(self.convert)  # type: ignore[call-overload]
            raise ValueError(f"{rule}, got {raw!r}" if rule else str(exc)) from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, got {raw!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be >= {self.minimum:g}, got {value}")
        return value


class EnvArgumentParser(argparse.ArgumentParser):
    """argparse with `add_setting(flag, env, default, help, type, choices, minimum)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.settings: dict[str, Setting] = {}  # dest -> setting, in the order added

    @property
    def env_names(self) -> dict[str, str]:
        return {dest: s.env for dest, s in self.settings.items()}

    def add_setting(
        self,
        flag: str,
        env: str,
        default: Any,
        help: str,
        type: Callable[[str], Any] = str,
        choices: Sequence[str] | None = None,
        minimum: float | None = None,
    ) -> None:
        """Declare a setting; its value is checked after parsing (see `Setting.check`)."""
        dest = flag.lstrip("-").replace("-", "_")
        setting = Setting(flag, env, dest, default, help, type, tuple(choices) if choices else None, minimum)
        self.settings[dest] = setting
        metavar = "{" + ",".join(setting.choices) + "}" if setting.choices else None
        # argparse only captures the raw string; conversion happens in one place for both sources.
        self.add_argument(flag, dest=dest, default=default, action=_StoreGiven, metavar=metavar, help=f"{help} [env {env}]")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:  # type: ignore[override]
        parsed, rest = super().parse_known_args(args, namespace)
        _PARSED.update({s.flag: s for s in self.settings.values()})
        for dest, setting in self.settings.items():
            given = getattr(parsed, dest, None)
            if isinstance(given, _Given):
                raw, source = str(given), ""
            elif os.environ.get(setting.env, "") != "":
                raw, source = os.environ[setting.env], f" (from environment variable {setting.env})"
            else:
                continue  # the default, as declared
            try:
                setattr(parsed, dest, setting.check(raw))
            except ValueError as exc:
                self.error(f"{setting.flag} [env {setting.env}]: {exc}{source}")
        return parsed, rest


def parse_bool(text: str) -> bool:
    """'true/1/yes/on' → True, 'false/0/no/off' → False; anything else is an error."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def address_or_off(text: str) -> str:
    """A host:port, or 'off' (or empty) for a port the service does not open: ''."""
    return "" if text.lower() in ("", "off") else text


def add_remoting_settings(p: EnvArgumentParser, env: str, default_port: int, port: str) -> None:
    """The RocketMQ 4 remoting port of a service (--remoting-bind, 'off' disables it: read it
    through remoting_bind) and the largest frame it accepts."""
    p.add_setting("--remoting-bind", env, "", f"host:port of {port}; 'off' disables it; default: the --bind host, port {default_port}")
    p.add_setting("--remoting-max-frame-bytes", "QUARRY_REMOTING_MAX_FRAME_BYTES", 16 * 1024 * 1024, "largest remoting frame accepted; a larger one closes the connection", int, minimum=1024)


def remoting_bind(parser: EnvArgumentParser, args: argparse.Namespace, default_port: int) -> str:
    """Where the remoting port listens ('' when off), checked: by default on the --bind host,
    as RocketMQ takes its broker address from the machine (a fixed 127.0.0.1 could not be
    reached from other hosts, and every broker of a machine would have claimed it)."""
    raw, bind = args.remoting_bind, args.bind
    if raw.lower() == "off":
        return ""
    address = raw or f"{bind.rsplit(':', 1)[0]}:{default_port}"
    try:
        split_host_port(address)
    except ValueError as exc:
        parser.error(f"{named('--remoting-bind')}: {exc}")
    if address == bind:
        parser.error(f"{named('--remoting-bind')}: {address} is the gRPC --bind address; give the remoting port its own")
    return address


def add_frames_setting(p: "EnvArgumentParser") -> None:
    """--frames-port: where the router's unary calls may also come as plain TCP frames
    (quarry/frames.py; docs/decisions/internal-transport-plain-grpc.md)."""
    p.add_setting("--frames-port", "QUARRY_FRAMES_PORT", -1,
                  "TCP port on the --bind host for the router's unary calls as plain frames, told to the router on the gRPC port "
                  "(0: off, calls stay on gRPC; -1: any free port); never opened with ACL accounts or TLS on", int, minimum=-1)


def add_metrics_settings(p: "EnvArgumentParser") -> None:
    """--metrics-port and --metrics-host, the same for every service."""
    p.add_setting("--metrics-port", "QUARRY_METRICS_PORT", 0, "Prometheus metrics port (0: off)", int, minimum=0)
    p.add_setting("--metrics-host", "QUARRY_METRICS_HOST", "",
                  "address the metrics port listens on, e.g. 127.0.0.1 to keep topic names and counts on this host; default: the --bind host")


def metrics_host(args: argparse.Namespace) -> str:
    """Where the metrics port listens: --metrics-host, else the --bind host."""
    return args.metrics_host or args.bind.rsplit(":", 1)[0].strip("[]")


def add_process_settings(p: EnvArgumentParser) -> None:
    """Settings every service process has: --log-format / --log-level (configure_logging takes
    them), --event-loop (services/event_loop.py) and --shutdown-grace-ms (how long a stop
    waits for calls in flight)."""
    p.add_setting("--log-format", "QUARRY_LOG_FORMAT", "kv", "log line format: kv (key=value) or json", str.lower, ["kv", "json"])
    p.add_setting("--log-level", "QUARRY_LOG_LEVEL", "INFO", "log level", str.upper, ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"])
    p.add_setting("--event-loop", "QUARRY_EVENT_LOOP", "uvloop", "the process's event loop: uvloop (libuv, faster per call) or asyncio's own", str.lower, list(EVENT_LOOPS))
    p.add_setting("--shutdown-grace-ms", "QUARRY_SHUTDOWN_GRACE_MS", 5000,
                  "on SIGTERM, longest wait for calls in flight before they are cancelled (an idle service exits at once)", int, minimum=0)
