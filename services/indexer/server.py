"""The indexer gRPC servicer (skeleton: RPCs answer UNIMPLEMENTED until the index lands)."""
from __future__ import annotations

import argparse

from quarry.v1 import indexer_pb2, indexer_pb2_grpc
from services.log import configure_logging
from services.serving import Registration, start_server, wait_for_termination


class IndexerServicer(indexer_pb2_grpc.IndexerServiceServicer):
    """Every RPC inherits the generated UNIMPLEMENTED answer for now."""


def serve(args: argparse.Namespace) -> int:
    configure_logging()
    servicer = IndexerServicer()
    name = indexer_pb2.DESCRIPTOR.services_by_name["IndexerService"].full_name
    running = start_server(
        "indexer",
        args.bind,
        [Registration(lambda s: indexer_pb2_grpc.add_IndexerServiceServicer_to_server(servicer, s), name)],
    )
    wait_for_termination(running, "indexer", on_stop=lambda: None)
    return 0
