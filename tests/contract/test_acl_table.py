"""Access control has a rule for every request every door serves, and docs/reliability.md shows
exactly the rules the services check (scripts/acl_table.py makes the table from them)."""
from __future__ import annotations

from quarry.services import security
from quarry.services.remoting import acl
from quarry.v1 import commitlog_pb2, indexer_pb2, router_pb2
from scripts import acl_table


def test_every_quarry_v1_method_has_a_permission() -> None:
    methods = {m.name for module in (commitlog_pb2, indexer_pb2, router_pb2)
               for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods <= set(security.PERMISSIONS), f"no permission for {sorted(methods - set(security.PERMISSIONS))}: add it to services/security.py"


def test_every_remoting_request_served_has_a_rule() -> None:
    from quarry.services.commitlog.doors.remoting import RemotingBroker
    from quarry.services.query.doors.nameserver import NameServer

    broker = RemotingBroker.__new__(RemotingBroker)  # handlers() only names bound methods
    served = set(RemotingBroker.handlers(broker)) | set(NameServer.handlers(NameServer.__new__(NameServer)))
    ruled = set(acl.PERMISSIONS) | set(acl.SIGNATURE_ONLY)
    assert served <= ruled, f"request codes served without an access rule: {sorted(served - ruled)} (services/remoting/acl.py)"
    assert not set(acl.PERMISSIONS) & set(acl.SIGNATURE_ONLY)


def test_every_rocketmq5_rpc_served_has_a_rule_and_is_checked_by_it() -> None:
    import re
    from pathlib import Path

    from quarry.services.rmq5 import auth
    from quarry.services.rmq5.contract import service

    rpcs = {m.name for s in service.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert set(auth.PERMISSIONS) <= rpcs
    # Every check a servicer makes names its RPC and the map's permission for it.
    services = Path(auth.__file__).parent.parent
    sources = [*services.glob("rmq5/*.py"), *services.glob("*/doors/rmq5_*.py")]
    assert any("doors" in str(p) for p in sources), "the RocketMQ 5 doors were not found: the glob is stale"
    text = "".join(p.read_text() for p in sources)
    calls = re.findall(r'check\((?:md|client_calls\.metadata\(context\)), "(\w+)", (None|"\w+"|\([^)]*\))', text)
    assert calls, "no auth.check calls found: the pattern is stale"
    checked = {rpc for rpc, _ in calls}
    for rpc, permission in calls:
        assert rpc in auth.PERMISSIONS, f"{rpc} is checked but has no rule in services/rmq5/auth.py PERMISSIONS"
        assert eval(permission) == auth.PERMISSIONS[rpc], f"{rpc} is checked for {permission}, the rule says {auth.PERMISSIONS[rpc]!r}"
    served = checked | {"AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue"}  # (checked through _consumer_call's rpc)
    assert served <= set(auth.PERMISSIONS)
    # A consumer group's RPCs check the group too.
    for line in re.findall(r'check\((?:md|client_calls\.metadata\(context\)), (?:"\w+"|rpc), [^\n]*', text):
        rpc = re.search(r'"(\w+)"|(rpc)', line)
        named = rpc.group(1) if rpc and rpc.group(1) else "AckMessage"  # (_consumer_call's rpc: the consumer RPCs)
        if named in auth.GROUP_RPCS:
            assert "group=request.group.name" in line, f"{named} does not check its group: {line}"


def test_the_documented_table_is_the_one_the_maps_make() -> None:
    text = acl_table.DOC.read_text()
    assert acl_table.BEGIN in text and acl_table.END in text
    assert acl_table.rendered(text) == text, "docs/reliability.md's access table is stale: run `python -m scripts.acl_table --write`"
