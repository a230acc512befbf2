"""The commitlog gRPC servicer (skeleton: RPCs answer UNIMPLEMENTED until the store lands)."""
from __future__ import annotations

import argparse

from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc
from services.log import configure_logging
from services.serving import Registration, start_server, wait_for_termination


class CommitLogServicer(commitlog_pb2_grpc.CommitLogServiceServicer):
    """Every RPC inherits the generated UNIMPLEMENTED answer for now."""


def serve(args: argparse.Namespace) -> int:
    configure_logging()
    servicer = CommitLogServicer()
    name = commitlog_pb2.DESCRIPTOR.services_by_name["CommitLogService"].full_name
    running = start_server(
        "commitlog",
        args.bind,
        [Registration(lambda s: commitlog_pb2_grpc.add_CommitLogServiceServicer_to_server(servicer, s), name)],
    )
    wait_for_termination(running, "commitlog", on_stop=lambda: None)
    return 0
