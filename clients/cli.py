"""`quarry`: an mqadmin-style command line over the router.

Commands and options follow mqadmin (short and long names): queryMsgById -i, queryMsgByKey
-t -k [-b -e -m], queryMsgByUniqueKey -t -i [-a -b -e], queryMsgByOffset -t -b -i -o,
sendMessage -t -p [-k -c], topicList, topicRoute -t, brokerStatus [-b], clusterList,
unregisterBroker -b. `-n` (or $NAMESRV_ADDR) names the router(s) and `--json` prints the
protobuf JSON mapping as one document (`--json-lines`: one per line); all go anywhere on the
line. Option parsing and JSON printing live in `cli_options`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Callable

from quarry.clients.admin import AdminClient
from quarry.clients.cli_browse import BrowseCommands
from quarry.clients.cli_browse import add_parsers as add_browse_parsers
from quarry.clients.cli_options import (
    EXIT_CODES, EXIT_INCOMPLETE, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, add_option, common_options, human_time, json_output,
    print_json, proto_json,
)
from quarry.clients.errors import InvalidArgumentError, NotFoundError, QuarryError, UnavailableError
from quarry.clients.model import Message, QueryResult
from quarry.clients.producer import Producer
from quarry.formats import offset_msg_id
from quarry.v1 import commitlog_pb2, common_pb2, router_pb2

ROUTER_MAX_NUM = 2048  # the router's page cap; larger -m values are read page by page
EXIT_ERROR = EXIT_UNAVAILABLE  # kept for callers of the old name


def print_message(m: Message, out: Any) -> None:
    rows = [
        ("OffsetID:", m.offset_msg_id), ("Topic:", m.topic), ("Tags:", f"[{m.tags}]"), ("Keys:", f"[{' '.join(m.keys)}]"),
        ("Queue ID:", m.queue_id), ("Queue Offset:", m.queue_offset), ("CommitLog Offset:", m.commit_log_offset),
        ("Reconsume Times:", m.reconsume_times), ("Born Timestamp:", human_time(m.born_timestamp)),
        ("Store Timestamp:", human_time(m.store_timestamp)), ("Born Host:", m.born_host), ("Store Host:", m.store_host),
        ("System Flag:", m.sys_flag), ("Properties:", "{" + ", ".join(f"{k}={v}" for k, v in m.property_pairs) + "}"),
        ("Broker Name:", m.broker_name), ("Message Body:", m.body.decode("utf-8", errors="replace")),
    ]
    for label, value in rows:
        print(f"{label:<20s} {value}", file=out)


STATE_WORDS = {"CONSUMED": "CONSUMED", "IN_FLIGHT": "IN_FLIGHT", "NOT_YET_CONSUMED": "NOT_CONSUME_YET",
               "RETRYING": "RETRYING", "DEAD_LETTERED": "DEAD_LETTERED", "FILTERED": "CONSUMED_BUT_FILTERED"}


def track_row(g: Any) -> dict[str, Any]:
    """One group's consume status as plain data (--json and the table)."""
    state = common_pb2.ConsumeState.Name(g.state).removeprefix("CONSUME_STATE_")
    row: dict[str, Any] = {"group": g.group, "state": state, "online": g.online, "source": g.source}
    for name in ("attempt", "invisible_until_ms", "consumed_at_ms", "dead_lettered_at_ms", "due_at_ms"):
        if getattr(g, name):
            row[name] = getattr(g, name)
    if g.expression:
        row["expression"] = g.expression
    if g.note:
        row["note"] = g.note
    return row


def print_track(rows: list[dict[str, Any]], out: Any) -> None:
    """mqadmin's track section: one line per consumer group."""
    print("", file=out)
    if not rows:
        print("WARN: No Consumer", file=out)
        return
    print(f"{'#ConsumerGroup':<32s} {'#TrackType':<22s} {'#Online':<8s} #Detail", file=out)
    for r in rows:
        detail = []
        if "attempt" in r:
            detail.append(f"attempt {r['attempt']}")
        for key, label in (("invisible_until_ms", "invisible until"), ("consumed_at_ms", "acked at"),
                           ("dead_lettered_at_ms", "dead-lettered at"), ("due_at_ms", "due at")):
            if key in r:
                detail.append(f"{label} {human_time(r[key])}")
        if "note" in r:
            detail.append(r["note"])
        print(f"{r['group']:<32s} {STATE_WORDS.get(r['state'], r['state']):<22s} {str(r['online']).lower():<8s} {'; '.join(detail)}", file=out)


def report_incomplete(result: QueryResult, err: Any) -> None:
    for b in result.failed_brokers:
        print(f"WARNING: broker {b.broker_name} did not answer ({b.error_code}: {b.error_message}); the result may be incomplete", file=err)


def result_code(result: QueryResult) -> int:
    if result.failed_brokers:
        return EXIT_INCOMPLETE
    return EXIT_OK if result.messages else EXIT_NOT_FOUND


Tracks = list[list[dict[str, Any]] | None]


def result_json(result: QueryResult, tracks: Tracks | None) -> dict[str, Any]:
    """A query's answer as --json prints it: the router's QueryResult, plus `tracks` (one per
    message) when the command shows consume status."""
    data = proto_json(result.raw) if result.raw is not None else {}
    if tracks is not None:
        data["tracks"] = tracks
    return data


def merged_json(answers: list[tuple[QueryResult, Tracks]]) -> dict[str, Any]:
    """Several ids' answers as one QueryResult document, shaped as one id's: messages and
    tracks in the order of the ids, one outcome per broker (a failure kept over an answer),
    complete only when every answer was."""
    if len(answers) == 1:
        return result_json(*answers[0])
    raw = router_pb2.QueryResult(complete=True)
    outcomes: dict[str, common_pb2.BrokerOutcome] = {}
    tracks: Tracks = []
    for result, result_tracks in answers:
        one = result.raw if result.raw is not None else router_pb2.QueryResult(complete=True)
        raw.messages.extend(one.messages)
        for o in one.brokers:
            kept = outcomes.get(o.broker_name)
            if kept is None or (kept.answered and not o.answered):  # another id's answer never hides a failure
                outcomes[o.broker_name] = o
        raw.complete = raw.complete and one.complete
        raw.collisions_filtered += one.collisions_filtered
        raw.copies += one.copies
        raw.notes.extend(n for n in one.notes if n not in raw.notes)
        if one.searched_begin_timestamp and (not raw.searched_begin_timestamp or one.searched_begin_timestamp < raw.searched_begin_timestamp):
            raw.searched_begin_timestamp = one.searched_begin_timestamp
        raw.searched_end_timestamp = max(raw.searched_end_timestamp, one.searched_end_timestamp)
        tracks += result_tracks
    raw.brokers.extend(outcomes.values())
    return result_json(QueryResult.from_proto(raw), tracks)


class Cli(BrowseCommands):
    def __init__(self, args: argparse.Namespace, out: Any, err: Any) -> None:
        self.args, self.out, self.err = args, out, err
        self.admin = AdminClient(args.namesrv)

    def tracks(self, result: QueryResult) -> list[list[dict[str, Any]] | None]:
        """Consume status of each found message (queryMsgById / queryMsgByUniqueKey, as mqadmin
        prints its track section); None for a message whose broker did not answer."""
        out: list[list[dict[str, Any]] | None] = []
        for m in result.messages:
            try:
                out.append([track_row(g) for g in self.admin.track(m.topic, m.broker_name, m.queue_id, m.queue_offset)])
            except QuarryError as exc:
                print(f"WARNING: consume status of {m.unique_key or m.offset_msg_id} unavailable: {exc}", file=self.err)
                out.append(None)
        return out

    def emit_result(self, result: QueryResult, table: bool = False, track: bool = False) -> int:
        tracks = self.tracks(result) if track else []
        if self.args.json:
            print_json(self.args, self.out, result_json(result, tracks if track else None))
        elif table:
            print(f"{'#Message ID':<56s} {'#QID':>4s} {'#Offset':>12s} {'#Broker':<12s} {'#Store Time'}", file=self.out)
            for i, m in enumerate(result.messages):
                print(f"{(m.unique_key or m.offset_msg_id):<56s} {m.queue_id:>4d} {m.queue_offset:>12d} {m.broker_name:<12s} {human_time(m.store_timestamp)}", file=self.out)
                for r in (tracks[i] or []) if track else []:
                    print(f"    {r['group']:<32s} {STATE_WORDS.get(r['state'], r['state'])}", file=self.out)
            if result.next_token:
                print(f"more: --token {result.next_token}", file=self.out)
        else:
            for i, m in enumerate(result.messages):
                if i:
                    print("", file=self.out)
                print_message(m, self.out)
                if track and tracks[i] is not None:
                    print_track(tracks[i], self.out)  # type: ignore[arg-type]
            if result.copies > 1:
                print(f"\n{result.copies} stored copies carry this unique key (-a shows all)", file=self.out)
        return self.reported(result)

    def reported(self, result: QueryResult) -> int:
        """What stderr says of an answer (brokers that did not answer, nothing found); its exit code."""
        report_incomplete(result, self.err)
        if not result.messages and not self.args.json:
            print("not found: no message matched" + (f" ({'; '.join(result.notes)})" if result.notes else ""), file=self.err)
        return result_code(result)

    def queryMsgById(self) -> int:
        codes = []
        answers: list[tuple[QueryResult, Tracks]] = []  # --json: printed together, as one document
        for n, msg_id in enumerate(self.args.id):
            if n and not self.args.json:
                print("", file=self.out)
            try:
                result = self._one_id(msg_id)
            except QuarryError as exc:
                codes.append(report_error(exc, self.err, prefix=f"-i {msg_id}: "))
                continue
            if self.args.json:
                answers.append((result, self.tracks(result)))
                codes.append(self.reported(result))
            else:
                codes.append(self.emit_result(result, track=True))
        if answers:
            print_json(self.args, self.out, merged_json(answers), lines=[result_json(*answer) for answer in answers])
        # The worst outcome decides: bad input, then unavailable, incomplete, not found.
        for code in (EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_INCOMPLETE, EXIT_NOT_FOUND):
            if code in codes:
                return code
        return EXIT_OK

    def _one_id(self, msg_id: str) -> QueryResult:
        try:
            offset_msg_id.decode(msg_id)
            is_offset_id = True
        except ValueError:
            is_offset_id = False
        if is_offset_id:
            try:
                return self.admin.query_by_id(msg_id)
            except (NotFoundError, InvalidArgumentError):
                if not self.args.topic:
                    raise
        if not self.args.topic:
            raise InvalidArgumentError("INVALID_ARGUMENT", "not an offsetMsgId; give -t <topic> to look it up as a unique key")
        return self.admin.query_by_unique_key(self.args.topic, msg_id)

    def queryMsgByKey(self) -> int:
        want, token = self.args.max, self.args.token
        result = self.admin.query_by_key(self.args.topic, self.args.key, min(want, ROUTER_MAX_NUM), self.args.begin, self.args.end, token)
        merged = result
        # Past the router's page cap, read on page by page (the answer is one list).
        while len(merged.messages) < want and merged.next_token:
            page = self.admin.query_by_key(self.args.topic, self.args.key, min(want - len(merged.messages), ROUTER_MAX_NUM), self.args.begin, self.args.end, merged.next_token)
            merged = merged.extended(page)
        return self.emit_result(merged, table=True, track=self.args.track)

    def queryMsgByUniqueKey(self) -> int:
        return self.emit_result(self.admin.query_by_unique_key(self.args.topic, self.args.id, self.args.all, self.args.begin, self.args.end), track=True)

    def queryMsgByOffset(self) -> int:
        return self.emit_result(self.admin.query_by_offset(self.args.topic, self.args.broker, self.args.queue, self.args.offset))

    def sendMessage(self) -> int:
        with Producer(self.args.namesrv) as producer:
            result = producer.send(self.args.topic, self.args.body.encode("utf-8"), keys=self.args.keys or None, tags=self.args.tags or "")
        if self.args.json:
            print_json(self.args, self.out, proto_json(result.raw) if result.raw is not None else {})
        else:
            print(result, file=self.out)
        return EXIT_OK

    def topicList(self) -> int:
        topics = self.admin.topics()
        if self.args.json:
            print_json(self.args, self.out, proto_json(router_pb2.ListTopicsResponse(topics=topics)))
        else:
            print("\n".join(topics), file=self.out)
        return EXIT_OK

    def topicRoute(self) -> int:
        print_json(self.args, self.out, proto_json(self.admin.topic_route(self.args.topic)))  # JSON with or without --json, as mqadmin
        return EXIT_OK

    def clusterList(self) -> int:
        brokers = self.admin.brokers()
        if self.args.json:
            print_json(self.args, self.out, proto_json(router_pb2.ListBrokersResponse(brokers=brokers)))
        else:
            print(f"{'#Cluster Name':<16s} {'#Broker Name':<16s} {'#Commitlog':<24s} {'#Indexer':<24s} {'#Store Host':<24s} {'#Status'}", file=self.out)
            for b in brokers:
                status = f"MISSING (last heartbeat {human_time(b.last_heartbeat_ms)})" if b.missing else "live"
                print(f"{b.cluster_name:<16s} {b.broker_name:<16s} {b.commitlog_addr:<24s} {b.indexer_addr:<24s} {b.store_host:<24s} {status}", file=self.out)
        return EXIT_INCOMPLETE if any(b.missing for b in brokers) else EXIT_OK

    def unregisterBroker(self) -> int:
        self.admin.unregister_broker(self.args.broker)
        print(f"broker {self.args.broker} unregistered", file=self.out)
        return EXIT_OK

    def brokerStatus(self) -> int:
        brokers = [b for b in self.admin.brokers() if not self.args.broker or b.broker_name == self.args.broker]
        if not brokers:
            raise NotFoundError("NOT_FOUND", f"-b {self.args.broker}: no such broker")
        rows: list[tuple[str, commitlog_pb2.GetStoreStatusResponse | None, str]] = []
        for b in brokers:
            if b.missing:
                rows.append((b.broker_name, None, f"missing: no heartbeat since {human_time(b.last_heartbeat_ms)}"))
                continue
            try:
                rows.append((b.broker_name, self.admin.broker_status(b.commitlog_addr), ""))
            except UnavailableError as exc:
                rows.append((b.broker_name, None, f"{exc.code}: {exc.message}"))
        if self.args.json:
            print_json(self.args, self.out, {"brokers": [{"brokerName": name, **({"status": proto_json(st)} if st is not None else {"error": error})}
                                                         for name, st, error in rows]})
        else:
            for name, st, error in rows:
                print(f"[{name}]", file=self.out)
                if st is None:
                    print(f"  {'error':<18s}: {error}", file=self.out)
                    continue
                for k, v in (("min_offset", st.min_offset), ("max_offset", st.max_offset), ("committed_offset", st.committed_offset),
                             ("segments", len(st.segments)), ("topics", len(st.topics)), ("flush_mode", "SYNC" if st.flush_mode == 2 else "ASYNC"),
                             ("read_only", st.read_only), ("corruption", list(st.corruption)), ("problems", list(st.problems))):
                    print(f"  {k:<18s}: {v}", file=self.out)
        failed = sum(1 for _, st, _ in rows if st is None)
        return EXIT_OK if not failed else (EXIT_UNAVAILABLE if failed == len(rows) else EXIT_INCOMPLETE)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quarry", description="mqadmin-style queries over Quarry routers.", epilog=EXIT_CODES + TIME_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common_options(p, top=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="<command>")

    def add(name: str, alias: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, aliases=[alias], help=help, description=help, epilog=EXIT_CODES + TIME_HELP,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.set_defaults(handler=name)
        common_options(sp)
        return sp

    s = add("queryMsgById", "query-msg-by-id", "messages by offsetMsgId (or unique key with -t)")
    add_option(s, "-i", "--msgId", "--id", dest="id", kind="ids", required=True, help="offsetMsgId; several separated by commas")
    add_option(s, "-t", "--topic", default="", help="topic, to look ids up as unique keys when they are not offsetMsgIds")
    s = add("queryMsgByKey", "query-msg-by-key", "messages by business key, newest first")
    add_option(s, "-t", "--topic", required=True, help="topic")
    add_option(s, "-k", "--msgKey", "--key", dest="key", required=True, help="key (one KEYS token)")
    add_option(s, "-b", "--beginTimestamp", "--begin", dest="begin", kind="time", default=0, help="earliest store time (default: the oldest retained)")
    add_option(s, "-e", "--endTimestamp", "--end", dest="end", kind="time", default=0, help="latest store time (default: now)")
    add_option(s, "-m", "--maxNum", "--max", dest="max", kind="positive", default=64, help="most messages to print (default 64; pages are read as needed)")
    add_option(s, "--token", default="", help="continuation token printed after a page (more: --token ...)")
    add_option(s, "--track", action="store_true", help="each message's consume status per consumer group (one call per message)")
    s = add("queryMsgByUniqueKey", "query-msg-by-unique-key", "a message by unique key (client msgId)")
    add_option(s, "-t", "--topic", required=True, help="topic")
    add_option(s, "-i", "--msgId", "--id", dest="id", required=True, help="unique key (client msgId)")
    s.add_argument("-a", "--showAll", "--all", dest="all", action="store_true", help="every stored copy, not only the earliest")
    add_option(s, "-b", "--beginTimestamp", "--begin", dest="begin", kind="time", default=0,
               help="search only from this store time (default: the id's own window, then the whole retained index)")
    add_option(s, "-e", "--endTimestamp", "--end", dest="end", kind="time", default=0, help="search only up to this store time (default: now)")
    s = add("queryMsgByOffset", "query-msg-by-offset", "the message at a queue offset")
    add_option(s, "-t", "--topic", required=True, help="topic")
    add_option(s, "-b", "--brokerName", "--broker", dest="broker", required=True, help="broker name")
    add_option(s, "-i", "--queueId", "--queue", dest="queue", kind="non_negative", required=True, help="queue id")
    add_option(s, "-o", "--offset", kind="non_negative", required=True, help="queue offset")
    s = add("sendMessage", "send-message", "send one message")
    add_option(s, "-t", "--topic", required=True, help="topic")
    add_option(s, "-p", "--body", required=True, help="message body (UTF-8 text)")
    add_option(s, "-k", "--keys", default="", help="keys, several separated by spaces (as RocketMQ's setKeys)")
    add_option(s, "-c", "--tags", default="", help="tag")
    add("topicList", "topic-list", "topics of known brokers")
    s = add("topicRoute", "topic-route", "live brokers and queues of a topic")
    add_option(s, "-t", "--topic", required=True, help="topic")
    s = add("brokerStatus", "broker-status", "store status of each broker")
    add_option(s, "-b", "--brokerName", "--broker", dest="broker", default="", help="only this broker")
    add("clusterList", "cluster-list", "brokers, live and missing (stopped heartbeating), with their addresses")
    s = add("unregisterBroker", "unregister-broker", "forget a broker on every router (a missing broker is reported until then)")
    add_option(s, "-b", "--brokerName", "--broker", dest="broker", required=True, help="broker name")
    add_browse_parsers(add)
    return p


TIME_HELP = """

times: epoch milliseconds, ISO-8601 with Z or an offset (2024-05-01T12:00:00Z), or a time
without zone (2024-05-01T12:00:00, or as printed: 2024-05-01 12:00:00,123) read in the zone
times are printed in (local time, set by TZ). Epoch seconds are refused."""


def report_error(exc: QuarryError, err: Any, prefix: str = "") -> int:
    if isinstance(exc, NotFoundError):
        print(f"not found: {prefix}{exc.message}", file=err)
        return EXIT_NOT_FOUND
    if isinstance(exc, InvalidArgumentError):
        print(f"invalid argument: {prefix}{exc.message}", file=err)
        return EXIT_INVALID
    if isinstance(exc, UnavailableError):
        print(f"unavailable: {prefix}{exc.message}", file=err)
        return EXIT_UNAVAILABLE
    print(f"error: {prefix}{exc}", file=err)
    return EXIT_UNAVAILABLE


def main(argv: list[str] | None = None, out: Any = None, err: Any = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        return _main(argv, out, err)
    except BrokenPipeError:
        # `quarry ... | head -1`: the reader left; say nothing more (and no traceback at exit).
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK


def _main(argv: list[str] | None, out: Any, err: Any) -> int:
    parser = build_parser()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # usage and --help where the caller reads
            args = parser.parse_args(argv)
        json_output(args)
    except SystemExit as exc:
        return EXIT_INVALID if exc.code else EXIT_OK
    try:
        cli = Cli(args, out, err)
    except ValueError as exc:
        print(f"invalid argument: -n: {exc}", file=err)
        return EXIT_INVALID
    handler: Callable[[], int] = getattr(cli, args.handler)
    try:
        code = handler()
    except QuarryError as exc:
        code = report_error(exc, err)
    finally:
        cli.admin.close()
    out.flush()  # here, where a reader that left (`| head -1`) is caught, not at exit
    return code
