"""What the RocketMQ 5 SDK tests (Python and Node.js) share: the SDK's configuration for a
cluster, a router and a broker serving TLS under a throwaway CA, and the check that a sent
message is found again through the router by its id, each key and its queue offset."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rocketmq import ClientConfiguration, Credentials

from quarry.clients.admin import AdminClient
from quarry.clients.model import Message as Found
from scripts.launcher import LocalCluster
from tests.e2e.conftest import wait_until
from tests.e2e.pki import make_pki


def client_config(cluster: LocalCluster, credentials: Credentials | None = None) -> ClientConfiguration:
    assert cluster.router is not None
    return ClientConfiguration(cluster.router.address, credentials or Credentials(), request_timeout=5)


@contextmanager
def tls_cluster(root: Path, monkeypatch: pytest.MonkeyPatch, router_host: str, broker_host: str) -> Iterator[tuple[LocalCluster, dict[str, str]]]:
    """A router and one broker serving TLS; yields the cluster and the PKI's files (pki["ca"])."""
    pki = make_pki(root / "pki", [router_host, broker_host])
    env = {"QUARRY_TLS_CERT": pki["server_cert"], "QUARRY_TLS_KEY": pki["server_key"], "QUARRY_TLS_CA": pki["ca"]}
    for k, v in env.items():  # the launcher's health checks and the admin client speak TLS too
        monkeypatch.setenv(k, v)
    c = LocalCluster(root=root / "c", indexer_args=["--hash-slots", "101", "--index-num", "1000"], env=env)
    with c.running({"broker-a": broker_host}, router_host=router_host):
        yield c, pki


@contextmanager
def acl_cluster(root: Path, monkeypatch: pytest.MonkeyPatch, accounts: list[dict], router_host: str, broker_host: str) -> Iterator[LocalCluster]:  # type: ignore[type-arg]
    """A router and one broker enforcing these accounts plus an admin `ops` (`ops-secret`), whose
    keys sign the indexer's calls and the test's own quarry.v1 calls (the admin client)."""
    acl = root / "acl.json"
    acl.write_text(json.dumps({"accounts": [*accounts, {"access_key": "ops", "secret_key": "ops-secret", "admin": True}]}))
    ops = {"QUARRY_ACCESS_KEY": "ops", "QUARRY_SECRET_KEY": "ops-secret"}
    for k, v in ops.items():
        monkeypatch.setenv(k, v)
    c = LocalCluster(root=root / "c", indexer_args=["--hash-slots", "101", "--index-num", "1000"], env={"QUARRY_ACL_FILE": str(acl), **ops})
    with c.running({"broker-a": broker_host}, router_host=router_host):
        yield c


def found_everywhere(admin: AdminClient, topic: str, message_id: str, offset: int, keys: tuple[str, ...]) -> Found:
    """The message by SDK id, by each key and by queue offset: the same stored record each time."""
    by_id = wait_until(lambda: admin.query_by_unique_key(topic, message_id).messages, what=f"{message_id} indexed")[0]  # type: ignore[index]
    assert by_id.unique_key == message_id and by_id.queue_offset == offset
    for key in keys:
        hits = wait_until(lambda: [m for m in admin.query_by_key(topic, key).messages if m.unique_key == message_id], what=f"key {key}")
        assert hits[0].offset_msg_id == by_id.offset_msg_id  # type: ignore[index]
    (at_offset,) = admin.query_by_offset(topic, by_id.broker_name, by_id.queue_id, offset).messages
    assert at_offset.offset_msg_id == by_id.offset_msg_id
    return by_id
