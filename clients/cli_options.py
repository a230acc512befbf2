"""Option parsing shared by every `quarry` command, so each command reads as mqadmin does.

- `add_option(parser, "-t", "--topic", ...)`: mqadmin's short and long names (plus any
  alias); every option has help text.
- `common_options(parser)`: `-n/--namesrvAddr`, `--json` and `--json-lines`, accepted before
  or after the command name (mqadmin puts `-n` after it).
- `print_json`: every command's JSON output, one document (or JSON Lines), never several
  documents back to back.
- Times (`parse_time`, one parser for every command): epoch milliseconds, or ISO-8601 with
  `Z` or an offset, or a time without zone (ISO, as printed: `2024-05-01 12:00:00,123`, or
  mqadmin's `2024-05-01#12:00:00:123`) read in the zone times are printed in (the local zone,
  `TZ`). A value that looks like seconds is refused.
- Errors name the flag as the user typed it (`-b 1700000000: ...`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Sequence

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

from quarry.clients.routers import parse_router_addresses

# Below this an epoch value is taken for seconds: 10^11 ms is 1973-03-03, 10^11 s is year 5138.
SECONDS_LIMIT = 100_000_000_000
PRINTED = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[,.](\d{1,6}))?$")
MQADMIN = re.compile(r"^(\d{4}-\d{2}-\d{2})#(\d{2}:\d{2}:\d{2}):(\d{3})$")  # printMsg's yyyy-MM-dd#HH:mm:ss:SSS

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

EXIT_CODES = """exit codes:
  0  found (or done)
  1  nothing found
  2  bad input (the message names the flag and the rule)
  3  unavailable (no router answered, or the broker asked did not)
  4  incomplete: some brokers did not answer, so the result may miss messages"""

EXIT_OK, EXIT_NOT_FOUND, EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_INCOMPLETE = 0, 1, 2, 3, 4


def proto_json(msg: ProtoMessage) -> dict[str, Any]:
    """--json output: the protobuf JSON mapping, every field shown (the shape does not depend
    on values): lowerCamelCase keys, bytes in base64, 64-bit integers as strings."""
    return MessageToDict(msg, always_print_fields_with_no_presence=True)


def print_json(args: argparse.Namespace, out: Any, document: Any, lines: Sequence[Any] | None = None) -> None:
    """The one way a command prints JSON. --json: `document`, one JSON document (a command
    with several answers merges them into it), which `json.load` reads whole; --json-lines:
    each of `lines` (default: the document) as one compact JSON document per line."""
    if getattr(args, "json_lines", False):
        for item in [document] if lines is None else lines:
            print(json.dumps(item, separators=(",", ":")), file=out)
    else:
        print(json.dumps(document, indent=1), file=out)


def camel_keys(value: Any) -> Any:
    """The same key style for JSON that is not a protobuf message (snake_case → lowerCamelCase)."""
    if isinstance(value, dict):
        return {(k.split("_")[0] + "".join(w[:1].upper() + w[1:] for w in k.split("_")[1:]) if isinstance(k, str) else k): camel_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def human_time(ms: int) -> str:
    """As mqadmin prints times: yyyy-MM-dd HH:mm:ss,SSS in the local zone (TZ)."""
    dt = datetime.fromtimestamp(ms / 1000).astimezone()
    return dt.strftime("%Y-%m-%d %H:%M:%S") + f",{ms % 1000:03d}"


def parse_time(text: str) -> int:
    """Epoch ms from any accepted form (see module doc); ValueError says what was expected."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        value = int(text)
        if value < 0:
            raise ValueError("must be >= 0")
        if 0 < value < SECONDS_LIMIT:
            raise ValueError(f"looks like seconds; give epoch milliseconds ({value * 1000}) or an ISO-8601 time")
        return value
    printed = PRINTED.match(text) or MQADMIN.match(text)
    if printed:
        date, clock, frac = printed.groups()
        text = f"{date}T{clock}" + (f".{frac.ljust(3, '0')}" if frac else "")
    try:
        dt = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError as exc:
        if printed or "must be in" in str(exc):  # the right shape, an impossible date: say which part
            raise ValueError(str(exc)) from None
        raise ValueError("expected epoch milliseconds, or an ISO-8601 time such as 2024-05-01T12:00:00Z, "
                         "2024-05-01T14:00:00+02:00 or 2024-05-01 12:00:00,123 (local time, as printed; also 2024-05-01#12:00:00:123)") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # the local zone: the one times are printed in
    return (dt - _EPOCH) // timedelta(milliseconds=1)  # exact: no float rounding


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("expected a whole number") from None
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("expected a whole number") from None
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _router_list(text: str) -> str:
    parse_router_addresses(text, "router")
    return text


def _id_list(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise ValueError("expected one id or several separated by commas")
    return ids


class _Converted(argparse.Action):
    """Stores convert(value); a ValueError becomes a usage error naming the flag as typed."""

    def __init__(self, option_strings: Sequence[str], dest: str, convert: Callable[[str], Any] = str, **kwargs: Any) -> None:
        self.convert = convert
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: str | None = None) -> None:
        try:
            setattr(namespace, self.dest, self.convert(values))
        except ValueError as exc:
            parser.error(f"{option_string or self.dest} {values!r}: {exc}")


Converters: dict[str, Callable[[str], Any]] = {
    "time": parse_time,
    "positive": _positive_int,
    "non_negative": _non_negative_int,
    "routers": _router_list,
    "ids": _id_list,
    "str": str,
}


def add_option(parser: argparse.ArgumentParser, *names: str, help: str, kind: str = "str", **kwargs: Any) -> None:
    """One option under all its names (`-t`, `--topic`, ...), converted as `kind` names."""
    if kwargs.get("action") in ("store_true", "store_false"):
        parser.add_argument(*names, help=help, **kwargs)
        return
    kwargs.setdefault("metavar", {"time": "TIME", "positive": "N", "non_negative": "N", "ids": "ID[,ID]"}.get(kind))
    if kwargs["metavar"] is None:
        del kwargs["metavar"]
    parser.add_argument(*names, action=_Converted, convert=Converters[kind], help=help, **kwargs)


def namesrv_default() -> str:
    return os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876")


def common_options(parser: argparse.ArgumentParser, top: bool = False) -> None:
    """-n/--namesrvAddr, --json and --json-lines; on a subcommand they default to SUPPRESS, so
    a value given before the command name is kept when none is given after it (`json_output`
    reads the two JSON flags)."""
    default_n: Any = namesrv_default() if top else argparse.SUPPRESS
    default_json: Any = False if top else argparse.SUPPRESS
    add_option(parser, "-n", "--namesrvAddr", "--namesrv", dest="namesrv", kind="routers", default=default_n, metavar="ADDR[;ADDR]",
               help="router address host:port, several as 'a:9876;b:9876' (tried in turn) [env NAMESRV_ADDR, default 127.0.0.1:9876]")
    parser.add_argument("--json", action="store_true", default=default_json,
                        help="print one JSON document (the protobuf JSON mapping of the answer: lowerCamelCase keys, 64-bit numbers "
                             "as strings); queryMsgById with several ids prints their answers as one result")
    parser.add_argument("--json-lines", dest="json_lines", action="store_true", default=default_json,
                        help="print JSON Lines instead: one compact JSON document per line (queryMsgById: one line per id)")


def json_output(args: argparse.Namespace) -> None:
    """After parsing: --json-lines is JSON output too (`args.json` is what commands test)."""
    args.json_lines = bool(getattr(args, "json_lines", False))
    args.json = bool(getattr(args, "json", False)) or args.json_lines
