"""The browse-by-time, trace and id commands of the `quarry` CLI (mqadmin's printMsg,
printMsgByQueue, queryMsgTraceById, DecodeMessageId, plus searchOffset).

Exit codes as for every command: 0 found, 1 nothing found, 2 bad input, 3 unavailable,
4 incomplete (some broker did not answer, or a browse window reaches into segments retention
deleted: the result misses messages).
"""
from __future__ import annotations

import argparse
import codecs
from datetime import datetime
from typing import Any, Callable

from quarry.clients.cli_options import add_option, camel_keys, human_time, print_json, proto_json
from quarry.clients.errors import InvalidArgumentError, NotFoundError
from quarry.clients.model import Message, QueryResult
from quarry.formats import message_id, message_trace

EXIT_OK, EXIT_NOT_FOUND, EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_INCOMPLETE = 0, 1, 2, 3, 4
DEFAULT_PAGE = 256
TRACE_PAGE = 64


_ms = human_time  # one way to print times in every command (local zone, as read back)


def _charset(name: str) -> str:
    try:
        return codecs.lookup(name).name
    except LookupError:
        raise InvalidArgumentError("INVALID_ARGUMENT", f"-c/--charsetName: unknown charset {name!r} (e.g. UTF-8, GBK)") from None


def message_line(m: Message, charset: str, print_body: bool) -> str:
    """One message as mqadmin's printMsg prints it: MSGID, the MessageExt fields, BODY."""
    props = "{" + ", ".join(f"{k}={v}" for k, v in m.property_pairs) + "}"
    sched = f", scheduled=true, deliverTime={_ms(m.deliver_timestamp)}, realTopic={m.real_topic}" if m.scheduled else ""
    body = m.body.decode(charset, errors="replace") if print_body else "NOT PRINT BODY"
    return (f"MSGID: {m.unique_key or m.offset_msg_id} MessageExt [brokerName={m.broker_name}, queueId={m.queue_id}, "
            f"storeSize={m.store_size}, queueOffset={m.queue_offset}, sysFlag={m.sys_flag}, bornTimestamp={_ms(m.born_timestamp)}, "
            f"bornHost={m.born_host}, storeTimestamp={_ms(m.store_timestamp)}, storeHost={m.store_host}, "
            f"msgId={m.offset_msg_id}, commitLogOffset={m.commit_log_offset}, bodyCRC={m.body_crc}, reconsumeTimes={m.reconsume_times}, "
            f"topic={m.topic}, tags={m.tags}, keys={' '.join(m.keys)}, properties={props}{sched}] BODY: {body}")


class BrowseCommands:
    """Mixed into the CLI: needs self.args, self.out, self.err, self.admin."""

    args: argparse.Namespace
    out: Any
    err: Any
    admin: Any

    def _browse(self, fetch: Callable[[str, int], QueryResult]) -> int:
        """Fetch pages until the window is done, --max messages were printed, or a broker fails.

        A page incomplete with every broker answering (messages of the window deleted by
        retention: the router's notes name the range) does not stop the browse, as no retry
        would bring them back: the rest is printed, then the notes, and the exit code is 4."""
        charset = _charset(self.args.charset)
        print_body = self.args.print_body.lower() != "false"
        limit = self.args.max
        token = self.args.token
        shown: list[Message] = []
        raws: list[Any] = []
        failed: dict[str, str] = {}
        notes: dict[str, bool] = {}  # each note once, in order; True when its page was incomplete
        gone = False  # some page was incomplete with every broker answering
        none_answered = False
        next_token, retry_token = "", ""
        while True:
            page_size = min(self.args.page_size, limit - len(shown)) if limit else self.args.page_size
            result = fetch(token, page_size)
            for m in result.messages:
                if not self.args.json:
                    print(message_line(m, charset, print_body), file=self.out)
            shown += result.messages
            raws += list(result.raw.messages) if result.raw is not None else []
            next_token = result.next_token
            for note in result.notes:
                notes[note] = notes.get(note, False) or not result.complete
            gone = gone or (not result.complete and not result.failed_brokers)
            if result.failed_brokers:
                failed.update({b.broker_name: f"{b.error_code}: {b.error_message}" for b in result.failed_brokers})
                retry_token = token  # this page again, once the brokers answer
                none_answered = all(not b.answered for b in result.brokers)
                break
            if not next_token or (limit and len(shown) >= limit):
                break
            token = next_token
        if self.args.json:
            print_json(self.args, self.out, {"messages": [_msg_json(m, print_body) for m in raws], "complete": not failed and not gone,
                                             "failedBrokers": failed, "nextToken": next_token, "retryToken": retry_token, "notes": list(notes)})
        else:
            if next_token and not failed:
                print(f"more: --token {next_token}", file=self.out)
        for name, why in failed.items():
            print(f"WARNING: broker {name} did not answer ({why}); the result may be incomplete. "
                  f"Retry this page with --token '{retry_token}'", file=self.err)
        for note, warns in notes.items():
            print(f"WARNING: {note}" if warns else f"note: {note}", file=self.err)
        if failed:
            return EXIT_UNAVAILABLE if none_answered and not shown else EXIT_INCOMPLETE
        if gone:
            return EXIT_INCOMPLETE
        return EXIT_OK if shown else EXIT_NOT_FOUND

    def printMsg(self) -> int:
        a = self.args
        return self._browse(lambda token, n: self.admin.browse_topic(a.topic, a.begin, a.end, a.sub_expression, a.oldest_first, n, token))

    def printMsgByQueue(self) -> int:
        a = self.args
        return self._browse(lambda token, n: self.admin.browse_topic(a.topic, a.begin, a.end, a.sub_expression, a.oldest_first, n, token,
                                                                     broker_name=a.broker_name, queue_id=a.queue_id))

    def searchOffset(self) -> int:
        a = self.args
        r = self.admin.search_offset(a.topic, a.broker_name, a.queue_id, a.timestamp, a.upper)
        if a.json:
            print_json(a, self.out, proto_json(r))
        else:
            print(f"offset={r.queue_offset} (queue range [{r.min_queue_offset}, {r.max_queue_offset}))", file=self.out)
        return EXIT_OK

    def queryMsgTraceById(self) -> int:
        """mqadmin's queryMsgTraceById: the trace topic's messages keyed by the id, decoded."""
        a = self.args
        contexts: list[message_trace.TraceContext] = []
        problems: list[str] = []
        token, failed = "", {}
        answered = False
        while True:
            try:
                result = self.admin.query_by_key(a.trace_topic, a.msg_id, TRACE_PAGE, a.begin, a.end, token)
            except NotFoundError:
                break  # no broker holds the trace topic: no trace
            for m in result.messages:
                decoded = message_trace.contexts_for(m.body.decode("utf-8", errors="replace"), a.msg_id, m.born_host.rsplit(":", 1)[0].strip("[]"))
                contexts += decoded.contexts
                problems += [f"{m.offset_msg_id}: {p}" for p in decoded.problems]
            failed.update({b.broker_name: f"{b.error_code}: {b.error_message}" for b in result.failed_brokers})
            answered = answered or any(b.answered for b in result.brokers)
            token = result.next_token
            if not token or len(contexts) >= a.max_num > 0:
                break
        contexts.sort(key=lambda c: (c.timestamp, c.trace_type))
        if a.json:
            print_json(a, self.out, camel_keys({"msg_id": a.msg_id, "trace_topic": a.trace_topic, "contexts": [c.to_json() for c in contexts],
                                                "problems": problems, "complete": not failed}) | {"failedBrokers": failed})
        else:
            print_trace(contexts, self.out)
        for p in problems:
            print(f"WARNING: trace record {p}", file=self.err)
        for name, why in failed.items():
            print(f"WARNING: broker {name} did not answer ({why}); the trace may be incomplete", file=self.err)
        if failed:
            return EXIT_UNAVAILABLE if not answered and not contexts else EXIT_INCOMPLETE
        return EXIT_OK if contexts else EXIT_NOT_FOUND

    def DecodeMessageId(self) -> int:
        local = datetime.now().astimezone()
        try:
            info = message_id.describe(self.args.message_id, int(local.timestamp() * 1000), local.tzinfo)  # type: ignore[arg-type]
        except message_id.MessageIdError as exc:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"-i/--messageId: {exc}") from None
        if self.args.json:
            print_json(self.args, self.out, camel_keys(info))
            return EXIT_OK
        if "offset_msg_id" in info:
            o = info["offset_msg_id"]
            print(f"as offsetMsgId: storeHost={o.get('store_host', '?')} commitLogOffset={o.get('commit_log_offset', '?')}"
                  + (f" ({o['error']})" if "error" in o else ""), file=self.out)
        if "unique_key_v4" in info:
            u = info["unique_key_v4"]
            print(f"as unique key (4.x): ip={u['ip']} pid={u['pid']} classLoaderHash={u['class_loader_hash']} "
                  f"date={_ms(u['nearly_time_ms'])} (month start + {u['ms_since_month_start']} ms, read in this machine's zone) counter={u['counter']}", file=self.out)
        if "unique_key_v5" in info:
            u = info["unique_key_v5"]
            print(f"as unique key (5.x): mac={u['mac']} pid={u['pid']} date={_ms(u['time_ms_if_utc'])} "
                  f"(if the producer ran in UTC; {u['seconds_since_2021']} s since 2021-01-01 in its zone) sequence={u['sequence']}", file=self.out)
        return EXIT_OK


def _msg_json(m: Any, print_body: bool) -> dict[str, Any]:
    """A StoredMessage in the protobuf JSON mapping (as every --json prints messages); -d false drops the body."""
    out = proto_json(m)
    if not print_body:
        out.pop("body", None)
    return out


def print_trace(contexts: list[message_trace.TraceContext], out: Any) -> None:
    """The layout mqadmin prints: each Pub, then the SubAfter rows grouped by consumer group."""
    row = "{:<10s} {:<20s} {:<20s} {:<20s} {:<10s} {:<10s}"
    for c in contexts:
        if c.trace_type == "Pub":
            print(row.format("#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status"), file=out)
            print(row.format("Pub", c.group, c.client_host, _ms(c.timestamp)[:19], f"{c.cost_time_ms}ms", "success" if c.success else "failed"), file=out)
            print("", file=out)
    groups: dict[str, list[message_trace.TraceContext]] = {}
    for c in contexts:
        if c.trace_type == "SubAfter":
            groups.setdefault(c.group, []).append(c)
    for group, rows in groups.items():
        print(row.format("#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes", "#Status"), file=out)
        for c in rows:
            print(row.format("Sub", group, c.client_host, _ms(c.timestamp)[:19] if c.timestamp else "-", f"{c.cost_time_ms}ms", "success" if c.success else "failed"), file=out)
        print("", file=out)


def add_parsers(add: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    """The subcommands, with mqadmin's short and long option names (times and numbers read by
    cli_options, so an error names the flag as typed)."""
    for name, alias, help_text in (("printMsg", "print-msg", "every message of a topic stored in a time window, in store-time order"),
                                   ("printMsgByQueue", "print-msg-by-queue", "every message of one broker's queue stored in a time window")):
        s = add(name, alias, help_text)
        s.add_argument("-t", "--topic", required=True, help="topic name")
        if name == "printMsgByQueue":
            s.add_argument("-a", "--brokerName", dest="broker_name", required=True, help="broker name")
            add_option(s, "-i", "--queueId", dest="queue_id", kind="non_negative", required=True, help="queue id")
        add_option(s, "-b", "--beginTimestamp", dest="begin", kind="time", default=0, help="earliest store time: epoch ms, ISO time or yyyy-MM-dd#HH:mm:ss:SSS (default 0)")
        add_option(s, "-e", "--endTimestamp", dest="end", kind="time", default=0, help="latest store time, inclusive: epoch ms, ISO time or yyyy-MM-dd#HH:mm:ss:SSS (default now)")
        s.add_argument("-s", "--subExpression", dest="sub_expression", default="*", help="tag expression: *, TagA, or 'TagA || TagB'")
        s.add_argument("-c", "--charsetName", dest="charset", default="UTF-8", help="charset to print bodies with (default UTF-8)")
        s.add_argument("-d", "--printBody", dest="print_body", default="true", help="print bodies: true (default) or false")
        s.add_argument("--oldest-first", action="store_true", help="oldest store time first (default newest first)")
        add_option(s, "--max", kind="non_negative", default=0, help="stop after this many messages and print the token to continue (default: all)")
        add_option(s, "--page-size", kind="positive", default=DEFAULT_PAGE, help=f"messages per request, 1..1024 (default {DEFAULT_PAGE})")
        s.add_argument("--token", default="", help="continue from this token (printed when more remain)")
    s = add("searchOffset", "search-offset", "the queue offset of a store time (RocketMQ's searchOffset)")
    s.add_argument("-t", "--topic", required=True, help="topic name")
    s.add_argument("-a", "--brokerName", dest="broker_name", required=True, help="broker name")
    add_option(s, "-i", "--queueId", dest="queue_id", kind="non_negative", required=True, help="queue id")
    add_option(s, "-s", "--timestamp", kind="time", required=True, help="store time: epoch ms, ISO time or yyyy-MM-dd#HH:mm:ss:SSS")
    s.add_argument("--upper", action="store_true", help="the last offset at or before the time (default: the first at or after)")
    s = add("queryMsgTraceById", "query-msg-trace-by-id", "the send/consume trace of a message id")
    s.add_argument("-i", "--msgId", dest="msg_id", required=True, help="message id (the producer's msgId)")
    s.add_argument("-t", "--traceTopic", dest="trace_topic", default=message_trace.DEFAULT_TRACE_TOPIC, help=f"trace topic (default {message_trace.DEFAULT_TRACE_TOPIC})")
    add_option(s, "-b", "--beginTimestamp", dest="begin", kind="time", default=0, help="earliest store time of trace records")
    add_option(s, "-e", "--endTimestamp", dest="end", kind="time", default=0, help="latest store time of trace records (default now)")
    add_option(s, "-c", "--maxNum", dest="max_num", kind="non_negative", default=0, help="stop after this many trace contexts (default: all)")
    s = add("DecodeMessageId", "decode-message-id", "what an offsetMsgId or unique key holds (offline)")
    s.add_argument("-i", "--messageId", dest="message_id", required=True, help="offsetMsgId or unique key")
