"""`quarry`: an mqadmin-style command line over the router.

Subcommands and flags follow mqadmin: queryMsgById -i, queryMsgByKey -t -k [-b -e -m],
queryMsgByUniqueKey -t -i [-a], queryMsgByOffset -t -b -i -o, sendMessage -t -p [-k -c],
topicList, topicRoute -t, brokerStatus [-b], clusterList. `-n` or $NAMESRV_ADDR is the
router. Exit codes: 0 found/done, 1 not found, 2 bad input, 3 unavailable, 4 other error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from typing import Any, Callable

from quarry.clients.admin import AdminClient
from quarry.clients.cli_browse import BrowseCommands
from quarry.clients.cli_browse import add_parsers as add_browse_parsers
from quarry.clients.errors import InvalidArgumentError, NotFoundError, QuarryError, UnavailableError
from quarry.clients.model import Message, QueryResult
from quarry.clients.producer import Producer
from quarry.formats import offset_msg_id

EXIT_OK, EXIT_NOT_FOUND, EXIT_INVALID, EXIT_UNAVAILABLE, EXIT_ERROR = 0, 1, 2, 3, 4


def parse_time(text: str) -> int:
    """Epoch milliseconds, or an ISO-8601 time (UTC when no zone is given)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected epoch milliseconds or an ISO-8601 time, got {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def human_time(ms: int) -> str:
    """As mqadmin prints times: yyyy-MM-dd HH:mm:ss,SSS (local time)."""
    dt = datetime.fromtimestamp(ms / 1000)
    return dt.strftime("%Y-%m-%d %H:%M:%S") + f",{ms % 1000:03d}"


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


def report_incomplete(result: QueryResult, err: Any) -> None:
    for b in result.failed_brokers:
        print(f"WARNING: broker {b.broker_name} did not answer ({b.error_code}: {b.error_message}); the result may be incomplete", file=err)


class Cli(BrowseCommands):
    def __init__(self, args: argparse.Namespace, out: Any, err: Any) -> None:
        self.args, self.out, self.err = args, out, err
        self.admin = AdminClient(args.namesrv)

    def emit_result(self, result: QueryResult, table: bool = False) -> int:
        if self.args.json:
            print(json.dumps({
                "messages": [m.to_json() for m in result.messages], "complete": result.complete,
                "brokers": [b.__dict__ for b in result.brokers], "copies": result.copies,
                "collisions_filtered": result.collisions_filtered, "notes": result.notes, "next_token": result.next_token,
            }, indent=1), file=self.out)
        elif table:
            print(f"{'#Message ID':<56s} {'#QID':>4s} {'#Offset':>12s} {'#Broker':<12s} {'#Store Time'}", file=self.out)
            for m in result.messages:
                print(f"{(m.unique_key or m.offset_msg_id):<56s} {m.queue_id:>4d} {m.queue_offset:>12d} {m.broker_name:<12s} {human_time(m.store_timestamp)}", file=self.out)
            if result.next_token:
                print(f"more: --token {result.next_token}", file=self.out)
        else:
            for i, m in enumerate(result.messages):
                if i:
                    print("", file=self.out)
                print_message(m, self.out)
            if result.copies > 1:
                print(f"\n{result.copies} stored copies carry this unique key (-a shows all)", file=self.out)
        report_incomplete(result, self.err)
        return EXIT_OK

    def queryMsgById(self) -> int:
        msg_id = self.args.id
        try:
            offset_msg_id.decode(msg_id)
            is_offset_id = True
        except ValueError:
            is_offset_id = False
        if is_offset_id:
            try:
                return self.emit_result(self.admin.query_by_id(msg_id))
            except (NotFoundError, InvalidArgumentError):
                if not self.args.topic:
                    raise
        if not self.args.topic:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"-i {msg_id}: not an offsetMsgId; give -t <topic> to look it up as a unique key")
        return self.emit_result(self.admin.query_by_unique_key(self.args.topic, msg_id))

    def queryMsgByKey(self) -> int:
        result = self.admin.query_by_key(self.args.topic, self.args.key, self.args.max, self.args.begin, self.args.end, self.args.token)
        return self.emit_result(result, table=True)

    def queryMsgByUniqueKey(self) -> int:
        return self.emit_result(self.admin.query_by_unique_key(self.args.topic, self.args.id, self.args.all))

    def queryMsgByOffset(self) -> int:
        return self.emit_result(self.admin.query_by_offset(self.args.topic, self.args.broker, self.args.queue, self.args.offset))

    def sendMessage(self) -> int:
        keys = self.args.keys.split() if self.args.keys else None
        with Producer(self.args.namesrv) as producer:
            result = producer.send(self.args.topic, self.args.body.encode("utf-8"), keys=keys, tags=self.args.tags or "")
        if self.args.json:
            print(json.dumps({"send_status": result.send_status, "msg_id": result.msg_id, "offset_msg_id": result.offset_msg_id,
                              "broker_name": result.message_queue.broker_name, "queue_id": result.message_queue.queue_id,
                              "queue_offset": result.queue_offset}), file=self.out)
        else:
            print(result, file=self.out)
        return EXIT_OK

    def topicList(self) -> int:
        topics = self.admin.topics()
        print(json.dumps(topics) if self.args.json else "\n".join(topics), file=self.out)
        return EXIT_OK

    def topicRoute(self) -> int:
        route = self.admin.topic_route(self.args.topic)
        data = {"topic": route.topic, "brokers": [{"brokerName": b.broker_name, "addr": b.commitlog_addr, "queueNums": b.queue_count} for b in route.brokers]}
        print(json.dumps(data, indent=1), file=self.out)
        return EXIT_OK

    def clusterList(self) -> int:
        brokers = self.admin.brokers()
        if self.args.json:
            print(json.dumps([{"cluster": b.cluster_name, "broker": b.broker_name, "commitlog": b.commitlog_addr, "indexer": b.indexer_addr, "store_host": b.store_host} for b in brokers]), file=self.out)
            return EXIT_OK
        print(f"{'#Cluster Name':<16s} {'#Broker Name':<16s} {'#Commitlog':<24s} {'#Indexer':<24s} {'#Store Host'}", file=self.out)
        for b in brokers:
            print(f"{b.cluster_name:<16s} {b.broker_name:<16s} {b.commitlog_addr:<24s} {b.indexer_addr:<24s} {b.store_host}", file=self.out)
        return EXIT_OK

    def brokerStatus(self) -> int:
        brokers = [b for b in self.admin.brokers() if not self.args.broker or b.broker_name == self.args.broker]
        if not brokers:
            raise NotFoundError("NOT_FOUND", f"-b {self.args.broker}: no such live broker")
        rows = []
        code = EXIT_OK
        for b in brokers:
            try:
                st = self.admin.broker_status(b.commitlog_addr)
                rows.append({"broker": b.broker_name, "min_offset": st.min_offset, "max_offset": st.max_offset, "committed_offset": st.committed_offset,
                             "segments": len(st.segments), "topics": len(st.topics), "flush_mode": "SYNC" if st.flush_mode == 2 else "ASYNC",
                             "read_only": st.read_only, "corruption": list(st.corruption)})
            except UnavailableError as exc:
                rows.append({"broker": b.broker_name, "error": exc.message})
                code = EXIT_UNAVAILABLE
        if self.args.json:
            print(json.dumps(rows), file=self.out)
        else:
            for row in rows:
                print(f"[{row['broker']}]", file=self.out)
                for k, v in row.items():
                    if k != "broker":
                        print(f"  {k:<18s}: {v}", file=self.out)
        return code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quarry", description="mqadmin-style queries over a Quarry router.")
    p.add_argument("-n", "--namesrv", default=os.environ.get("NAMESRV_ADDR", "127.0.0.1:9876"), help="router address [env NAMESRV_ADDR]")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, alias: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, aliases=[alias], help=help)
        sp.set_defaults(handler=name)
        return sp

    s = add("queryMsgById", "query-msg-by-id", "a message by offsetMsgId (or unique key with -t)")
    s.add_argument("-i", "--id", required=True)
    s.add_argument("-t", "--topic", default="")
    s = add("queryMsgByKey", "query-msg-by-key", "messages by business key")
    s.add_argument("-t", "--topic", required=True)
    s.add_argument("-k", "--key", required=True)
    s.add_argument("-b", "--begin", type=parse_time, default=0, help="epoch ms or ISO time")
    s.add_argument("-e", "--end", type=parse_time, default=0, help="epoch ms or ISO time (default now)")
    s.add_argument("-m", "--max", type=int, default=64)
    s.add_argument("--token", default="", help="continuation token of the previous page")
    s = add("queryMsgByUniqueKey", "query-msg-by-unique-key", "a message by unique key (client msgId)")
    s.add_argument("-t", "--topic", required=True)
    s.add_argument("-i", "--id", required=True)
    s.add_argument("-a", "--all", action="store_true", help="every stored copy")
    s = add("queryMsgByOffset", "query-msg-by-offset", "the message at a queue offset")
    s.add_argument("-t", "--topic", required=True)
    s.add_argument("-b", "--broker", required=True)
    s.add_argument("-i", "--queue", type=int, required=True)
    s.add_argument("-o", "--offset", type=int, required=True)
    s = add("sendMessage", "send-message", "send one message")
    s.add_argument("-t", "--topic", required=True)
    s.add_argument("-p", "--body", required=True)
    s.add_argument("-k", "--keys", default="")
    s.add_argument("-c", "--tags", default="")
    add("topicList", "topic-list", "topics of live brokers")
    s = add("topicRoute", "topic-route", "brokers and queues of a topic")
    s.add_argument("-t", "--topic", required=True)
    s = add("brokerStatus", "broker-status", "store status of each broker")
    s.add_argument("-b", "--broker", default="")
    add("clusterList", "cluster-list", "live brokers")
    add_browse_parsers(add, parse_time)
    return p


def main(argv: list[str] | None = None, out: Any = None, err: Any = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_INVALID if exc.code else EXIT_OK
    cli = Cli(args, out, err)
    handler: Callable[[], int] = getattr(cli, args.handler)
    try:
        return handler()
    except NotFoundError as exc:
        print(f"not found: {exc.message}", file=err)
        return EXIT_NOT_FOUND
    except InvalidArgumentError as exc:
        print(f"invalid argument: {exc.message}", file=err)
        return EXIT_INVALID
    except UnavailableError as exc:
        print(f"unavailable: {exc.message}", file=err)
        return EXIT_UNAVAILABLE
    except QuarryError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_ERROR
    finally:
        cli.admin.close()
