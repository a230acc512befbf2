"""The query router gRPC servicer (skeleton: RPCs answer UNIMPLEMENTED until the registry lands)."""
from __future__ import annotations

import argparse

from quarry.v1 import router_pb2, router_pb2_grpc
from services.log import configure_logging
from services.serving import Registration, start_server, wait_for_termination


class QueryRouterServicer(router_pb2_grpc.QueryRouterServiceServicer):
    """Every RPC inherits the generated UNIMPLEMENTED answer for now."""


def serve(args: argparse.Namespace) -> int:
    configure_logging()
    servicer = QueryRouterServicer()
    name = router_pb2.DESCRIPTOR.services_by_name["QueryRouterService"].full_name
    running = start_server(
        "router",
        args.bind,
        [Registration(lambda s: router_pb2_grpc.add_QueryRouterServiceServicer_to_server(servicer, s), name)],
    )
    wait_for_termination(running, "router", on_stop=lambda: None)
    return 0
