"""The console's JSON layer: each `/api/...` request checked, turned into AdminClient calls,
and the answer (or the error) turned into one JSON shape.

Errors are mapped here once (`Api.handle`): bad input is 400 naming the field (the console's
own checks, or the router's INVALID_ARGUMENT read back to the console's parameter names);
not found 404; a router that cannot be reached (or that answers UNAVAILABLE) 503; ACL refusals
401/403. An incomplete answer is not an error: it is 200 with `complete: false` and
`failedBrokers` (each broker that did not answer, with its status code and words), plus
`expired` (what retention deleted of a browse window) and the router's `notes`.

Nothing is capped silently: a key search and a browse are paged with the router's
continuation token (`nextToken`), and a page whose brokers did not all answer carries
`retryToken` (the same page again). The histogram counts every message of the window by
reading the browse itself, in slices of `histogram_slice_s`, each answering with what it
counted and the token to go on with: exact, never sampled.
"""
from __future__ import annotations

import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from quarry.clients.errors import InvalidArgumentError, NotFoundError, QuarryError, UnavailableError
from quarry.clients.console import cluster_status, dead_letters, trace
from quarry.clients.model import Message, QueryResult
from quarry.formats import offset_msg_id, tag_expression, unique_key
from quarry.formats.topic import TopicError, validate_topic
from quarry.v1 import common_pb2

MAX_BROWSE_PAGE = 1024  # the router's BrowseTopic cap per request
MAX_KEY_PAGE = 2048  # the router's QueryMsgByKey cap per request
DEFAULT_PAGE = 50
MAX_BUCKETS = 1000
DEFAULT_BUCKETS = 60
PREVIEW_CHARS = 120
TOPIC_SEARCH_THREADS = 8

# The router's INVALID_ARGUMENT messages start with its request field; the console's parameter.
ROUTER_FIELDS = {
    "topic": "topic", "key": "q", "unique_key": "q", "offset_msg_id": "q", "continuation_token": "token", "token": "token",
    "tag_expression": "tags", "max_num": "pageSize", "begin_timestamp": "begin", "end_timestamp": "end",
    "queue_id": "queue", "queue_offset": "offset", "broker_name": "broker",
}


class BadInput(Exception):
    """A request parameter that fails its rule: 400 naming `field`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass
class Response:
    status: int
    body: Any  # a JSON document, or bytes (downloads)
    headers: dict[str, str] = field(default_factory=dict)


# ---- parameters -------------------------------------------------------------------------

def _text(params: dict[str, str], name: str, default: str = "") -> str:
    return (params.get(name) or default).strip()


def _int(params: dict[str, str], name: str, default: int | None = None, minimum: int = 0, maximum: int | None = None) -> int:
    raw = _text(params, name)
    if raw == "":
        if default is None:
            raise BadInput(name, "required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(name, f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadInput(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise BadInput(name, f"must be <= {maximum}, got {value}")
    return value


def _topic(params: dict[str, str], name: str = "topic", required: bool = True) -> str:
    topic = _text(params, name)
    if not topic and not required:
        return ""
    try:
        validate_topic(topic, name)
    except TopicError as exc:
        raise BadInput(name, str(exc).split(": ", 1)[-1]) from None
    return topic


def _tags(params: dict[str, str]) -> str:
    expression = _text(params, "tags")
    try:
        tag_expression.parse(expression, "tags")
    except tag_expression.TagExpressionError as exc:
        raise BadInput("tags", str(exc).split(": ", 1)[-1]) from None
    return expression


def _window(params: dict[str, str], now_ms: int, required: bool = False) -> tuple[int, int]:
    """[begin, end] in epoch ms, inclusive; end 0 or absent is now (fixed here: the answer
    says which end was used, so later pages and links see the same window)."""
    begin = _int(params, "begin", None if required else 0)
    end = _int(params, "end", None if required else 0) or now_ms
    if end < begin:
        raise BadInput("end", f"must not be before begin ({end} < {begin})")
    return begin, end


def _order(params: dict[str, str]) -> bool:
    """True for oldest first."""
    order = _text(params, "order", "newest").lower()
    if order not in ("newest", "oldest"):
        raise BadInput("order", f"must be newest or oldest, got {order!r}")
    return order == "oldest"


# ---- answers ----------------------------------------------------------------------------

def body_preview(body: bytes, sys_flag: int) -> str:
    if sys_flag & 0x1:
        return f"(compressed body, {len(body)} bytes)"
    text = body[: PREVIEW_CHARS * 4].decode("utf-8", errors="replace")
    return text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS or len(body) > PREVIEW_CHARS * 4 else "")


def message_json(m: Message, with_body: bool = False) -> dict[str, Any]:
    """Every field of the stored message (RocketMQ MessageExt), lowerCamelCase."""
    out: dict[str, Any] = {
        "topic": m.topic, "flag": m.flag, "properties": [[k, v] for k, v in m.property_pairs], "keys": m.keys, "tags": m.tags,
        "uniqueKey": m.unique_key, "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commit_log_offset,
        "storeSize": m.store_size, "sysFlag": m.sys_flag, "bornTimestamp": m.born_timestamp, "bornHost": m.born_host,
        "storeTimestamp": m.store_timestamp, "storeHost": m.store_host, "reconsumeTimes": m.reconsume_times,
        "preparedTransactionOffset": m.prepared_transaction_offset, "bodyCrc": m.body_crc, "offsetMsgId": m.offset_msg_id,
        "brokerName": m.broker_name, "scheduled": m.scheduled, "deliverTimestamp": m.deliver_timestamp, "realTopic": m.real_topic,
        "bodySize": len(m.body), "bodyPreview": body_preview(m.body, m.sys_flag), "compressed": bool(m.sys_flag & 0x1),
    }
    if with_body:
        out["bodyBase64"] = base64.b64encode(m.body).decode("ascii")
    return out


def failed_json(result: QueryResult) -> list[dict[str, str]]:
    return [{"broker": b.broker_name, "code": b.error_code, "message": b.error_message} for b in result.failed_brokers]


def expired_json(expired: list[Any]) -> list[dict[str, Any]]:
    return [{
        "broker": e.broker_name, "fromPhysicalOffset": e.from_physical_offset, "toPhysicalOffset": e.to_physical_offset,
        "storedAtOrBefore": e.stored_at_or_before,
        "queues": [{"topic": q.topic, "queueId": q.queue_id, "fromQueueOffset": q.from_queue_offset, "toQueueOffset": q.to_queue_offset}
                   for q in e.queues],
    } for e in expired]


def result_json(result: QueryResult, **extra: Any) -> dict[str, Any]:
    out = {
        "messages": [message_json(m) for m in result.messages], "complete": result.complete, "failedBrokers": failed_json(result),
        "notes": list(result.notes), "expired": expired_json(result.expired), "nextToken": result.next_token,
        "brokersAsked": [b.broker_name for b in result.brokers],
    }
    out.update(extra)
    return out


def error_response(exc: Exception, routers: str) -> Response:
    """The one mapping of an error to the console's status codes (the API's and the login's)."""
    if isinstance(exc, BadInput):
        return Response(400, {"error": exc.message, "field": exc.field})
    if isinstance(exc, InvalidArgumentError):
        head = exc.message.split(":", 1)[0].split(" ", 1)[0].strip()
        return Response(400, {"error": exc.message, "field": ROUTER_FIELDS.get(head, ""), "code": exc.code})
    if isinstance(exc, NotFoundError):
        return Response(404, {"error": exc.message, "code": exc.code})
    if isinstance(exc, UnavailableError):
        return Response(503, {"error": f"router {routers} did not answer, or answered UNAVAILABLE: {exc.message}", "code": exc.code, "routers": routers})
    if isinstance(exc, QuarryError):
        status = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "RESOURCE_EXHAUSTED": 429}.get(exc.code, 502)
        return Response(status, {"error": exc.message, "code": exc.code})
    raise exc


# ---- the endpoints ----------------------------------------------------------------------

class Api:
    """`handle(path, params)` → Response; `admin` is an AdminClient (or anything with its methods)."""

    def __init__(self, admin: Any, histogram_slice_s: float = 1.5, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, producer: Any = None, resent: dead_letters.Resent | None = None) -> None:
        """`resent`: the console's record of dead letters already resent, shared by every
        session's Api (its own when not given)."""
        self.admin = admin
        self.histogram_slice_s = histogram_slice_s
        self.clock = clock
        self.monotonic = monotonic
        self.routes: dict[str, Callable[[dict[str, str]], Response]] = {
            "/api/info": self.info, "/api/search": self.search, "/api/browse": self.browse, "/api/histogram": self.histogram,
            "/api/message": self.message, "/api/body": self.body, "/api/track": self.track, "/api/cluster": self.cluster,
            "/api/topics": self.topics, "/api/status": self.status, "/api/trace": self.trace, "/api/copies": self.copies,
        }
        # State-changing endpoints: POST with a JSON body only, so a pasted link or a page of
        # another site (a form cannot send application/json) never resends anything.
        self.post_routes: dict[str, Callable[[dict[str, Any]], Response]] = {"/api/resend": self.resend}
        self._producer = producer
        self._producer_lock = threading.Lock()
        self._closed = False
        self.resent = resent if resent is not None else dead_letters.Resent()

    def handle_post(self, path: str, body: bytes, content_type: str) -> Response:
        route = self.post_routes.get(path)
        if route is None:
            return Response(404, {"error": f"no such endpoint for POST: {path}", "endpoints": sorted(self.post_routes)})
        try:
            if content_type.split(";", 1)[0].strip().lower() != "application/json":
                raise BadInput("Content-Type", f"must be application/json, got {content_type or 'none'!r}")
            try:
                doc = json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise BadInput("body", f"not a JSON document ({exc})") from None
            if not isinstance(doc, dict):
                raise BadInput("body", "must be a JSON object")
            return route(doc)
        except (BadInput, QuarryError) as exc:
            return error_response(exc, self.admin.router_addr)

    def producer(self) -> Any:
        with self._producer_lock:  # one per Api, even when two resends of a session arrive together
            if self._closed:  # its session ended while this request ran: a producer made now would never be closed
                raise QuarryError("SESSION_ENDED", "this console session ended (logged out or idle too long): nothing was sent; log in again")
            if self._producer is None:
                from quarry.clients.producer import Producer

                # signed as the admin's calls are: a session's resend is that operator's own send
                self._producer = Producer(self.admin.router_addr, timeout_s=self.admin.timeout_s, account=getattr(self.admin, "account", None))
            return self._producer

    def close(self) -> None:
        """Close the routers' channels this Api opened: its AdminClient's and, once a resend
        created it, its producer's (a session's Api is closed when the session ends)."""
        with self._producer_lock:
            producer, self._producer, self._closed = self._producer, None, True
        try:
            if producer is not None:
                producer.close()
        finally:
            self.admin.close()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def handle(self, path: str, params: dict[str, str]) -> Response:
        route = self.routes.get(path)
        if route is None:
            return Response(404, {"error": f"no such endpoint: {path}", "endpoints": sorted(self.routes)})
        try:
            return route(params)
        except (BadInput, QuarryError) as exc:
            return error_response(exc, self.admin.router_addr)

    # -- what the console talks to
    def info(self, params: dict[str, str]) -> Response:
        return Response(200, {"routers": self.admin.router_addr, "nowMs": self.now_ms()})

    def topics(self, params: dict[str, str]) -> Response:
        return Response(200, {"topics": self.admin.topics()})

    def cluster(self, params: dict[str, str]) -> Response:
        brokers = [{
            "brokerName": b.broker_name, "clusterName": b.cluster_name, "commitlogAddr": b.commitlog_addr, "indexerAddr": b.indexer_addr,
            "storeHost": b.store_host, "remotingAddr": b.remoting_addr, "rmq5Endpoint": b.rmq5_endpoint, "missing": b.missing,
            "lastHeartbeatMs": b.last_heartbeat_ms, "topics": [{"topic": t.topic, "queueCount": t.queue_count} for t in b.topics],
        } for b in self.admin.brokers()]
        return Response(200, {"routers": self.admin.router_addr, "brokers": brokers, "topics": self.admin.topics(), "nowMs": self.now_ms()})

    # -- one search box
    def search(self, params: dict[str, str]) -> Response:
        """q: an offsetMsgId, a unique key (4.x: 32/56 hex; 5.x message id: 34 hex from 01)
        or a key (with topic). Says which kind it took (`kind`) and how (`reading`)."""
        q = _text(params, "q")
        if not q:
            raise BadInput("q", "type an offsetMsgId, a message id (unique key) or a key")
        topic = _topic(params, required=False)
        now = self.now_ms()
        begin = _int(params, "begin", 0)
        end = _int(params, "end", 0)
        if end and end < begin:
            raise BadInput("end", f"must not be before begin ({end} < {begin})")
        token = _text(params, "token")
        shape = unique_key.id_kind(q)
        tried: list[str] = []
        if shape and not token:
            if shape == "v4":
                try:
                    result = self.admin.query_by_id(q)
                    if result.messages:
                        d = offset_msg_id.decode(q)
                        return Response(200, result_json(result, kind="offsetMsgId", query=q, tried=tried, reading=(
                            f"{len(q)} hex characters, read as an offsetMsgId: store host {d.ip}:{d.port}, commit log offset {d.offset}")))
                except (NotFoundError, InvalidArgumentError) as exc:
                    tried.append(f"not an offsetMsgId of this cluster ({exc.message})")
                kind, reading = "uniqueKey", f"{len(q)} hex characters: a RocketMQ 4 message id (unique key, UNIQ_KEY)"
            else:
                kind, reading = "uniqueKeyV5", "34 hex characters starting 01: a RocketMQ 5 message id (unique key, UNIQ_KEY)"
            answer = self._by_unique_key(q, topic, begin, end)
            if answer["messages"] or not topic:
                answer.update(kind=kind, query=q, tried=tried, reading=reading)
                return Response(200, answer)
            tried.append(f"no message with unique key {q} in {topic}")
        if not topic:
            raise BadInput("topic", f"{q!r} is not a message id (32 or 56 hex characters, or 34 starting 01): a key search needs a topic")
        if " " in q:
            raise BadInput("q", "a key has no spaces (KEYS holds keys separated by spaces)")
        page = _int(params, "pageSize", 64, minimum=1, maximum=MAX_KEY_PAGE)
        result = self.admin.query_by_key(topic, q, page, begin, end, token)  # end 0: the router's now (the token binds the window as sent)
        window = {"begin": begin, "end": end or now}
        return Response(200, result_json(result, kind="key", query=q, topic=topic, tried=tried, window=window,
                                         retryToken=token if result.failed_brokers else "",
                                         reading=f"a key (KEYS) of topic {topic}" + ("" if not tried else ", after the id readings found nothing")))

    def _by_unique_key(self, uid: str, topic: str, begin: int, end: int) -> dict[str, Any]:
        """Every copy with this UNIQ_KEY in `topic`, or in every topic the routers know when none
        is given (each asked; the answer lists the topics searched and those that failed)."""
        topics = [topic] if topic else self.admin.topics()

        def one(t: str) -> tuple[str, QueryResult | None, str]:
            try:
                return t, self.admin.query_by_unique_key(t, uid, return_all=True, begin=begin, end=end), ""
            except NotFoundError:
                return t, None, ""
            except UnavailableError as exc:  # none found and some broker did not answer
                return t, None, f"{exc.code}: {exc.message}"

        if len(topics) == 1:
            answers = [one(topics[0])]
        else:
            with ThreadPoolExecutor(TOPIC_SEARCH_THREADS) as pool:
                answers = list(pool.map(one, topics))
        messages: list[dict[str, Any]] = []
        failed: list[dict[str, str]] = []
        notes: list[str] = []
        complete = True
        for t, result, why in answers:
            if why:
                complete = False
                failed.append({"broker": "", "topic": t, "code": why.split(":", 1)[0], "message": why.split(": ", 1)[-1]})
                continue
            if result is None:
                continue
            complete = complete and result.complete
            messages += [message_json(m) for m in result.messages]
            failed += [dict(f, topic=t) for f in failed_json(result)]
            notes += list(result.notes)
        return {"messages": messages, "complete": complete, "failedBrokers": failed, "notes": notes, "expired": [], "nextToken": "",
                "searchedTopics": topics if not topic else [topic]}

    # -- topic browse
    def browse(self, params: dict[str, str]) -> Response:
        topic = _topic(params)
        begin, end = _window(params, self.now_ms())
        tags = _tags(params)
        oldest = _order(params)
        page = _int(params, "pageSize", DEFAULT_PAGE, minimum=1, maximum=MAX_BROWSE_PAGE)
        token = _text(params, "token")
        said: list[str] = []
        if not _text(params, "begin") and not token:
            begin, said = self._first_store_time(topic, end, tags)
        result = self.admin.browse_topic(topic, begin, end, tags, oldest, page, token)
        result.notes[:0] = said
        return Response(200, result_json(result, topic=topic, window={"begin": begin, "end": end}, tags=tags,
                                         order="oldest" if oldest else "newest", pageSize=page,
                                         retryToken=token if result.failed_brokers else "",
                                         brokersAnswered=[b.broker_name for b in result.brokers if b.answered]))

    def _first_store_time(self, topic: str, end: int, tags: str) -> tuple[int, list[str]]:
        """No begin given: the window starts at the store time of the topic's oldest message
        stored by `end` (the browse of [0, end], oldest first, one message), so the window and
        its histogram span what is there; the note says so."""
        first = self.admin.browse_topic(topic, 0, end, tags, True, 1, "")
        if first.messages and not first.failed_brokers:
            return first.messages[0].store_timestamp, ["no begin given: the window starts at the oldest message of the topic (the tag expression applied)"]
        return 0, []

    def histogram(self, params: dict[str, str]) -> Response:
        """Messages per interval across [begin, end], counted on the browse itself (every
        message of the window read, oldest first, 1,024 a page) for at most
        histogram_slice_s per request: `counts` are this slice's; pass `nextToken` back to go on;
        `done` once the window is read. A page with a broker that did not answer stops the
        count there (`failedBrokers`; `retryToken` counts that page again)."""
        topic = _topic(params)
        begin, end = _window(params, self.now_ms(), required=True)
        tags = _tags(params)
        buckets = _int(params, "buckets", DEFAULT_BUCKETS, minimum=1, maximum=MAX_BUCKETS)
        token = _text(params, "token")
        span = end - begin + 1
        width = -(-span // buckets)  # ceil: the last bucket may be shorter
        buckets = -(-span // width)
        counts = [0] * buckets
        counted = pages = 0
        expired: list[Any] = []
        notes: list[str] = []
        failed: list[dict[str, str]] = []
        retry = ""
        stop_at = self.monotonic() + self.histogram_slice_s
        complete = True
        while True:
            result = self.admin.browse_topic(topic, begin, end, tags, True, MAX_BROWSE_PAGE, token)
            pages += 1
            if result.failed_brokers:  # nothing of this page is counted: the retry counts it whole
                failed, retry, complete = failed_json(result), token, False
                break
            for m in result.messages:
                counts[max(0, min((m.store_timestamp - begin) // width, buckets - 1))] += 1  # the router checks the window
            counted += len(result.messages)
            expired += [e for e in result.expired if e.broker_name not in {x.broker_name for x in expired}]
            notes += [n for n in result.notes if n not in notes]
            complete = complete and result.complete
            token = result.next_token
            if not token or self.monotonic() >= stop_at:
                break
        return Response(200, {
            "topic": topic, "tags": tags, "window": {"begin": begin, "end": end}, "bucketMs": width, "buckets": buckets,
            "edges": [begin + i * width for i in range(buckets)] + [end + 1], "counts": counts, "counted": counted, "pages": pages,
            "nextToken": "" if failed else token, "done": not failed and not token, "complete": complete, "failedBrokers": failed,
            "retryToken": retry, "expired": expired_json(expired), "notes": notes, "sampled": False,
        })

    # -- one message
    def _one(self, params: dict[str, str]) -> Message:
        """The message named by `id` (an offsetMsgId) or by topic, broker, queue and offset."""
        msg_id = _text(params, "id")
        if msg_id:
            if unique_key.id_kind(msg_id) != "v4":
                raise BadInput("id", f"an offsetMsgId has 32 or 56 hex characters, got {msg_id!r}")
            result = self.admin.query_by_id(msg_id)
        else:
            topic = _topic(params)
            broker = _text(params, "broker")
            if not broker:
                raise BadInput("broker", "required (the broker that stores the message)")
            result = self.admin.query_by_offset(topic, broker, _int(params, "queue"), _int(params, "offset"))
        if not result.messages:
            raise NotFoundError("NOT_FOUND", "no such message")
        return result.messages[0]

    def message(self, params: dict[str, str]) -> Response:
        m = self._one(params)
        return Response(200, {"message": message_json(m, with_body=True),
                              "stored": {"broker": m.broker_name, "topic": m.topic, "queueId": m.queue_id, "queueOffset": m.queue_offset,
                                         "commitLogOffset": m.commit_log_offset, "storeHost": m.store_host, "storeSize": m.store_size,
                                         "offsetMsgId": m.offset_msg_id} | cluster_status.segment_of(self.admin, m.broker_name, m.commit_log_offset)})

    def body(self, params: dict[str, str]) -> Response:
        m = self._one(params)
        name = f"{m.offset_msg_id or 'message'}.bin"
        return Response(200, m.body, {"Content-Type": "application/octet-stream", "Content-Disposition": f'attachment; filename="{name}"'})

    def track(self, params: dict[str, str]) -> Response:
        topic = _topic(params)
        broker = _text(params, "broker")
        if not broker:
            raise BadInput("broker", "required (the broker that stores the message)")
        groups = self.admin.track(topic, broker, _int(params, "queue"), _int(params, "offset"))
        rows = []
        for g in groups:
            rows.append({"group": g.group, "state": common_pb2.ConsumeState.Name(g.state).removeprefix("CONSUME_STATE_"), "online": g.online,
                         "source": g.source, "attempt": g.attempt, "invisibleUntilMs": g.invisible_until_ms, "consumedAtMs": g.consumed_at_ms,
                         "deadLetteredAtMs": g.dead_lettered_at_ms, "dueAtMs": g.due_at_ms, "expression": g.expression, "note": g.note})
        return Response(200, {"groups": rows})

    # -- cluster status, trace, copies
    def status(self, params: dict[str, str]) -> Response:
        """Each broker's store, index, queues and consumer groups (cluster_status.py)."""
        return Response(200, cluster_status.cluster_status(self.admin) | {"nowMs": self.now_ms()})

    def trace(self, params: dict[str, str]) -> Response:
        """The message id's trace contexts (queryMsgTraceById), oldest first."""
        msg_id = _text(params, "id")
        if not msg_id:
            raise BadInput("id", "required (the message id, as producers and consumers trace it)")
        trace_topic = _topic(params, "traceTopic", required=False) or trace.message_trace.DEFAULT_TRACE_TOPIC
        return Response(200, trace.trace(self.admin, msg_id, trace_topic, _int(params, "begin", 0), _int(params, "end", 0)))

    def copies(self, params: dict[str, str]) -> Response:
        """Every stored message with this unique key, in every topic (a message sent twice, its
        retries and dead letters keep it), oldest first."""
        uid = _text(params, "uniqueKey")
        if not uid:
            raise BadInput("uniqueKey", "required")
        answer = self._by_unique_key(uid, _topic(params, required=False), 0, 0)
        answer["messages"].sort(key=lambda m: (m["storeTimestamp"], m["brokerName"], m["commitLogOffset"]))
        return Response(200, answer | {"uniqueKey": uid})

    # -- dead letters
    def resend(self, doc: dict[str, Any]) -> Response:
        """{"ids": [offsetMsgId, ...], "confirm": bool}: each dead letter read by its id and, with
        confirm, sent again to its original topic (dead_letters.py); without, the plan only.
        One answer per id, in order: its new ids, or why it was not resent."""
        ids = doc.get("ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise BadInput("ids", "a non-empty list of offsetMsgIds of dead letters")
        if len(ids) > dead_letters.MAX_RESEND:
            raise BadInput("ids", f"at most {dead_letters.MAX_RESEND} a request, got {len(ids)}")
        for i in ids:
            if unique_key.id_kind(i) != "v4":
                raise BadInput("ids", f"an offsetMsgId has 32 or 56 hex characters, got {i!r}")
        ids = [i.upper() for i in ids]  # the router reads the hex in either case: one dead letter, one spelling
        if len(set(ids)) != len(ids):
            raise BadInput("ids", "an id is listed twice (it would be resent twice)")
        confirm = doc.get("confirm", False)
        if not isinstance(confirm, bool):
            raise BadInput("confirm", "must be true or false")
        rows = []
        for i in ids:
            try:
                found = self.admin.query_by_id(i).messages
            except NotFoundError as exc:
                rows.append({"offsetMsgId": i, "refused": f"not found: {exc.message}"})
                continue
            if not found:
                rows.append({"offsetMsgId": i, "refused": "not found"})
                continue
            m = found[0]
            try:
                plan = dead_letters.plan(m)
            except dead_letters.NotResendable as exc:
                rows.append(dead_letters.plan_json(m, None, str(exc)))
                continue
            oid = (m.offset_msg_id or i).upper()
            earlier = self.resent.claim(oid) if confirm else self.resent.refusal(oid)
            if earlier is not None:
                why, sent_before = earlier
                row = dead_letters.plan_json(m, None, why)
                if sent_before is not None:
                    row["resentBefore"] = sent_before
                rows.append(row)
                continue
            row = dead_letters.plan_json(m, plan)
            if confirm:
                try:
                    sent = self.producer().send(plan.topic, plan.body, keys=plan.keys, tags=plan.tags, properties=plan.properties, flag=plan.flag)
                    row["sent"] = {"msgId": sent.msg_id, "offsetMsgId": sent.offset_msg_id, "topic": sent.message_queue.topic,
                                   "broker": sent.message_queue.broker_name, "queueId": sent.message_queue.queue_id,
                                   "queueOffset": sent.queue_offset, "status": sent.send_status}
                    self.resent.done(oid, row["sent"])
                except QuarryError as exc:
                    self.resent.release(oid)
                    row["error"] = {"code": exc.code, "message": exc.message}
                except BaseException:
                    self.resent.release(oid)
                    raise
            rows.append(row)
        return Response(200, {"confirmed": confirm, "results": rows,
                              "resent": sum(1 for r in rows if "sent" in r), "refused": sum(1 for r in rows if "refused" in r or "error" in r)})
