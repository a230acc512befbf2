"""docs/reliability.md's access table: door x request x account, made from the permission maps the
services check with, so it cannot drift.

`python -m scripts.acl_table` prints the table; `--write` puts it into docs/reliability.md between
the markers; a contract test checks the file holds exactly what this makes, and that every
request a door serves has a rule.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

BEGIN = "<!-- acl-table:begin -->"
END = "<!-- acl-table:end -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
# The four accounts: what each may do, per request, is the table's body.
EXAMPLE = [
    {"access_key": "admin", "secret_key": "-", "admin": True},
    {"access_key": "pub", "secret_key": "-", "topics": {"TopicA": ["publish"]}},
    {"access_key": "reader", "secret_key": "-", "topics": {"*": ["query"]}},
    {"access_key": "qx", "secret_key": "-", "topics": {"TopicX": ["query"]}},
]


def _accounts() -> list:  # type: ignore[type-arg]
    from quarry.services.security import Account, DEFAULT_GROUP_PERMS

    return [Account(a["access_key"], a["secret_key"], bool(a.get("admin")), {t: set(p) for t, p in a.get("topics", {}).items()},  # type: ignore[union-attr, attr-defined]
                    {}, DEFAULT_GROUP_PERMS) for a in EXAMPLE]


def _may(account, permission: str, topic_bound: bool) -> str:  # type: ignore[no-untyped-def]
    """What `account` may do with a request needing `permission` (on its topic, or on "*")."""
    if account.admin:
        return "yes"
    if permission == "admin":
        return "no"
    if permission == "group":
        return "its groups" if account.default_group_perms else "named groups"
    anywhere = permission in account.topics.get("*", set())
    if anywhere:
        return "yes"
    if not topic_bound:
        return "no"
    topics = sorted(t for t, perms in account.topics.items() if permission in perms and t != "*")
    return ", ".join(topics) if topics else "no"


def rows() -> list[tuple[str, str, str, list[str]]]:
    """(door, request, what it needs, what each example account may do)."""
    from quarry.services import security
    from quarry.services.remoting import acl
    from quarry.services.remoting import codes
    from quarry.services.rmq5 import auth as rmq5_auth
    from quarry.v1 import commitlog_pb2, indexer_pb2, router_pb2

    accounts = _accounts()
    out: list[tuple[str, str, str, list[str]]] = []
    for module in (commitlog_pb2, indexer_pb2, router_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                permission = security.PERMISSIONS[method.name]
                bound = not security._carries_no_topic(getattr(module, method.input_type.name))
                needs = f"{permission} on its topic" if bound and permission != "admin" else (permission if permission == "admin" else f'{permission} on "*"')
                out.append(("quarry.v1", f"{service.name}.{method.name}", needs, [_may(a, permission, bound) for a in accounts]))
    names: dict[int, str] = {}
    for name, value in vars(codes).items():  # request codes come first in codes.py (response codes reuse numbers)
        if isinstance(value, int) and name.isupper():
            names.setdefault(value, name)
    for code, need in sorted(acl.PERMISSIONS.items()):
        where = need.elsewhere or (f"its `{need.topic}` header's topic" if need.topic else '"*"')
        needs = ("the group permission" if need.permission == "group" else f"{need.permission} on {where}") + (
            f"; sub on the `{need.group}` group" if need.group and need.permission != "group" else (f" on the `{need.group}` group" if need.group else ""))
        bound = need.topic is not None or bool(need.elsewhere)
        out.append(("RocketMQ 4", f"{names.get(code, code)} ({code})", needs, [_may(a, need.permission, bound) for a in accounts]))
    for code, why in sorted(acl.SIGNATURE_ONLY.items()):
        out.append(("RocketMQ 4", f"{names.get(code, code)} ({code})", f"a valid signature: {why}", ["yes"] * len(accounts)))
    for rpc, need in rmq5_auth.PERMISSIONS.items():
        if need is None:
            out.append(("RocketMQ 5", rpc, "a valid signature (client bookkeeping, no topic)", ["yes"] * len(accounts)))
            continue
        anyof = (need,) if isinstance(need, str) else need
        cells = []
        for a in accounts:
            each = [_may(a, p, True) for p in anyof]
            cells.append("yes" if "yes" in each else (", ".join(sorted({c for c in each if c != "no"})) or "no"))
        if rpc in rmq5_auth.GROUP_RPCS:  # and sub on its group: each example account has the default group permission
            cells = [c if c == "no" else f"{c} (its groups)" if a.default_group_perms and not a.admin else c for c, a in zip(cells, accounts)]
        out.append(("RocketMQ 5", rpc, " or ".join(anyof) + " on its topic" + ("; sub on its group" if rpc in rmq5_auth.GROUP_RPCS else ""), cells))
    return out


def table() -> str:
    head = "| door | request | needs | " + " | ".join(a["access_key"] for a in EXAMPLE) + " |"
    lines = [head, "|" + "---|" * (3 + len(EXAMPLE))]
    lines += [f"| {door} | {req} | {needs} | " + " | ".join(cells) + " |" for door, req, needs, cells in rows()]
    return "\n".join(lines)


def rendered(text: str) -> str:
    """`text` with the table between the markers replaced by the current one."""
    before, _, rest = text.partition(BEGIN)
    _, _, after = rest.partition(END)
    return f"{before}{BEGIN}\n{table()}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--write", action="store_true", help=f"write the table into {DOC.name}")
    args = p.parse_args(argv)
    if args.write:
        DOC.write_text(rendered(DOC.read_text()))
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
