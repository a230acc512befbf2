"""Access control has a rule for every request every door serves, and docs/reliability.md shows
exactly the rules the services check (scripts/acl_table.py makes the table from them)."""
from __future__ import annotations

from quarry.services import security
from quarry.services.remoting import acl
from quarry.v1 import commitlog_pb2, indexer_pb2, multiplex_pb2, router_pb2
from scripts import acl_table


def test_every_quarry_v1_method_has_a_permission() -> None:
    methods = {m.name for module in (commitlog_pb2, indexer_pb2, router_pb2, multiplex_pb2)
               for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods <= set(security.PERMISSIONS), f"no permission for {sorted(methods - set(security.PERMISSIONS))}: add it to services/security.py"


def test_every_remoting_request_served_has_a_rule() -> None:
    from quarry.services.commitlog.remoting_broker import RemotingBroker
    from quarry.services.query.nameserver import NameServer

    broker = RemotingBroker.__new__(RemotingBroker)  # handlers() only names bound methods
    served = set(RemotingBroker.handlers(broker)) | set(NameServer.handlers(NameServer.__new__(NameServer)))
    ruled = set(acl.PERMISSIONS) | set(acl.SIGNATURE_ONLY)
    assert served <= ruled, f"request codes served without an access rule: {sorted(served - ruled)} (services/remoting/acl.py)"
    assert not set(acl.PERMISSIONS) & set(acl.SIGNATURE_ONLY)


def test_the_documented_table_is_the_one_the_maps_make() -> None:
    text = acl_table.DOC.read_text()
    assert acl_table.BEGIN in text and acl_table.END in text
    assert acl_table.rendered(text) == text, "docs/reliability.md's access table is stale: run `python -m scripts.acl_table --write`"
