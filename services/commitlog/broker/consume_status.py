"""Where each consumer group stands with one stored message: from the RocketMQ 5 pop state
(consumer_groups) and, for groups that only commit offsets (RocketMQ 4 remoting consumers),
from the committed offset. Plain data; the servicer converts it.
"""
from __future__ import annotations

from dataclasses import dataclass

from quarry.formats import tag_expression
from quarry.formats.topic import dlq_topic
from quarry.services.commitlog.storage.consumer_groups import ConsumerGroups, GroupTopic
from quarry.services.commitlog.storage.consumer_offsets import ConsumerOffsets

CONSUMED, IN_FLIGHT, NOT_YET_CONSUMED, RETRYING, DEAD_LETTERED, FILTERED = (
    "CONSUMED", "IN_FLIGHT", "NOT_YET_CONSUMED", "RETRYING", "DEAD_LETTERED", "FILTERED")


@dataclass
class GroupStatus:
    group: str
    state: str
    source: str  # "pop" or "offset"
    attempt: int = 0
    invisible_until_ms: int = 0
    consumed_at_ms: int = 0
    dead_lettered_at_ms: int = 0
    due_at_ms: int = 0
    expression: str = ""
    note: str = ""


def _pop_status(group: str, gt: GroupTopic, queue_id: int, offset: int, tag: str | None, now: int, max_attempts: int) -> GroupStatus:
    s = GroupStatus(group, NOT_YET_CONSUMED, "pop", expression=gt.expression)
    q = gt.queues.get(queue_id)
    if q is None:
        return s
    if offset in q.dead:
        s.state, s.dead_lettered_at_ms = DEAD_LETTERED, q.dead[offset]
        s.note = f"forwarded to {dlq_topic(group)}"
        return s
    if offset in q.acked:
        s.state, s.consumed_at_ms = CONSUMED, q.acked[offset]
        return s
    p = q.pending.get(offset)
    if p is not None:
        s.attempt = p.attempt
        if p.attempt == 0:
            if p.visible_at > now:
                s.due_at_ms, s.note = p.visible_at, "delayed: delivered at its delivery time"
            elif q.blocked(p):
                s.note = f"waiting for an earlier message of FIFO group {p.msg_group} to be acked"
            return s
        if p.visible_at > now:
            s.state, s.invisible_until_ms = IN_FLIGHT, p.visible_at
            return s
        s.state = RETRYING
        s.note = ("reached the maximum attempts: goes to the dead-letter topic" if p.attempt >= max_attempts
                  else f"not acked in time: delivered again as attempt {p.attempt + 1}")
        if q.blocked(p):
            s.note += f" after the earlier messages of FIFO group {p.msg_group}"
        return s
    if offset < q.next:
        try:
            matches = tag_expression.parse(gt.expression).matches_tag(tag)
        except tag_expression.TagExpressionError:
            matches = True
        if not matches:
            s.state, s.note = FILTERED, f"tag {tag!r} does not match the group's expression {gt.expression!r}"
        else:
            s.state, s.note = CONSUMED, "acked (ack time no longer remembered)"
    return s


def statuses(groups: ConsumerGroups, offsets: ConsumerOffsets, topic: str, queue_id: int, offset: int, tag: str | None,
             now: int, max_attempts: int) -> list[GroupStatus]:
    out: dict[str, GroupStatus] = {}
    with groups.lock():
        for group, gt in groups.groups_of(topic).items():
            out[group] = _pop_status(group, gt, queue_id, offset, tag, now, max_attempts)
    for group, queues in offsets.groups(topic).items():
        if group in out:
            continue
        committed = queues.get(queue_id)
        if committed is not None and offset < committed:
            out[group] = GroupStatus(group, CONSUMED, "offset", note=f"below the committed offset {committed}")
        else:
            out[group] = GroupStatus(group, NOT_YET_CONSUMED, "offset", note=f"committed offset {committed if committed is not None else 'none'}")
    return [out[g] for g in sorted(out)]
