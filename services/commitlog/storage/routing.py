"""Where a batch's messages go, before any byte is placed: broker semantics, as RocketMQ's
send processor checks a message before its store puts it (msgCheck): the topic named (created
when auto-creation is on), the queue asked for or the broker's round-robin choice.

Nothing changes until the append succeeded: topics to create and round-robin turns taken are
held in the `Routes` of the batch, and `Routing.commit` takes the turns afterwards (the append
saves the topics with its write).
"""
from __future__ import annotations

from typing import Sequence

from quarry.formats.topic import TopicError, validate_topic
from quarry.services.commitlog.storage.errors import NotFound
from quarry.services.commitlog.storage.message_input import MessageFields, not_one_topic, queue_out_of_range, reject
from quarry.services.commitlog.storage.store_state import StoreState


# A batch's routes: the queue of each message, the topics it creates (name -> queues, in order)
# and the round-robin turns it took (topic -> last turn). A plain tuple: built for every send.
Routes = tuple[list[int], dict[str, int], dict[str, int]]


class Routing:
    """The round-robin turns of one store's topics and the rules of a message's topic and queue."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        self._round_robin: dict[str, int] = {}  # replaced, never changed in place: readers hold no lock

    def next_turn(self, topic: str, queues: int) -> int:
        """The next round-robin queue of `topic` (the caller holds state.lock), as an append of
        one message leaving the queue to the broker would choose it."""
        turn = self._round_robin.get(topic, -1) + 1
        self._round_robin = {**self._round_robin, topic: turn}
        return turn % queues

    def route(self, msgs: Sequence[MessageFields], same_topic: bool, peer: tuple[str, int] | None, independent: bool) -> Routes:
        """The routes of `msgs` (the caller holds state.lock). A batch's messages that leave the
        queue to the broker follow the first one's, unless they are `independent` (each sent in
        a call of its own): each then takes its own round-robin turn."""
        config = self.state.config
        topics = self.state.topics
        many = len(msgs) > 1
        created: dict[str, int] = {}
        rr_old = self._round_robin
        rr: dict[str, int] = {}
        qids: list[int] = []
        add = qids.append
        cur_topic: str | None = None
        first_topic: str | None = None
        queues = qid = 0
        for i, m in enumerate(msgs):
            topic = m.topic
            new_topic = topic != cur_topic
            if new_topic:
                try:
                    validate_topic(topic)
                except TopicError:
                    reject(m, f"messages[{i}]." if many else "", config.max_message_size, peer)
                if first_topic is None:
                    first_topic = topic
                elif same_topic and topic != first_topic:
                    raise not_one_topic(i, first_topic)
                known = topics.get(topic)
                if known is None:
                    known = created.get(topic)
                if known is None:
                    if not config.auto_create_topics:
                        raise NotFound(f"topic {topic} does not exist and auto-creation is off")
                    known = created[topic] = config.default_queues
                queues = known
                cur_topic = topic
            want = m.queue_id
            if want < 0:
                if want < -1:
                    reject(m, f"messages[{i}]." if many else "", config.max_message_size, peer)
                if new_topic or independent:  # a batch's messages after the first follow it
                    turn = rr.get(topic)
                    turn = (rr_old.get(topic, -1) if turn is None else turn) + 1
                    rr[topic] = turn
                    qid = turn % queues
            elif want >= queues:
                raise queue_out_of_range(f"messages[{i}]." if many else "", want, topic, queues)
            else:
                qid = want
            add(qid)
        return qids, created, rr

    def commit(self, routes: Routes) -> None:
        """The batch of `routes` was stored: its round-robin turns are taken."""
        if routes[2]:
            self._round_robin = {**self._round_robin, **routes[2]}
