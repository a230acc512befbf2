"""The RocketMQ 4 ACL treats a group's own %RETRY%/%DLQ% topics as the group's resource, as
RocketMQ's PlainAccessResource does: a consumer with query on its topic and the group's
permission pulls, commits and sends back there; another group's retry topic stays closed."""
from __future__ import annotations

import pytest

from quarry.services.remoting import codes
from quarry.services.remoting.acl import RemotingAcl, sign
from quarry.services.remoting.command import RemotingCommand
from quarry.services.remoting.server import RemotingError
from quarry.services.security import Account

ACL = RemotingAcl({"jcon": Account("jcon", "s", False, {"J4Acl": {"query"}}, {"G": {"sub"}}, frozenset())})


def _check(code: int, fields: dict[str, str]) -> str:
    cmd = RemotingCommand(code, 1, 0, None, dict(fields))
    sign(cmd, "jcon", "s")
    try:
        ACL(cmd)
        return "admitted"
    except RemotingError as exc:
        return exc.remark


@pytest.mark.parametrize(("code", "fields"), [
    (codes.PULL_MESSAGE, {"topic": "J4Acl", "consumerGroup": "G", "queueId": "0"}),
    (codes.PULL_MESSAGE, {"topic": "%RETRY%G", "consumerGroup": "G", "queueId": "0"}),
    (codes.QUERY_CONSUMER_OFFSET, {"topic": "%RETRY%G", "consumerGroup": "G", "queueId": "0"}),
    (codes.UPDATE_CONSUMER_OFFSET, {"topic": "%RETRY%G", "consumerGroup": "G", "queueId": "0", "commitOffset": "1"}),
    (codes.SEND_MESSAGE_V2, {"a": "CLIENT_INNER_PRODUCER", "b": "%RETRY%G"}),
])
def test_a_consumer_uses_its_own_groups_retry_topic(code: int, fields: dict[str, str]) -> None:
    assert _check(code, fields) == "admitted"


@pytest.mark.parametrize(("code", "fields"), [
    (codes.PULL_MESSAGE, {"topic": "%RETRY%Other", "consumerGroup": "G", "queueId": "0"}),
    (codes.SEND_MESSAGE_V2, {"a": "CLIENT_INNER_PRODUCER", "b": "%DLQ%Other"}),
    (codes.PULL_MESSAGE, {"topic": "Elsewhere", "consumerGroup": "G", "queueId": "0"}),
])
def test_another_groups_retry_topic_or_another_topic_stays_closed(code: int, fields: dict[str, str]) -> None:
    assert "lacks" in _check(code, fields)
