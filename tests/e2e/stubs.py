"""gRPC stubs on a running LocalCluster for tests that call the services directly: the router's,
and each broker's commitlog (one channel per address, made on first use), closed together."""
from __future__ import annotations

import grpc

from quarry.v1 import commitlog_pb2_grpc, router_pb2_grpc
from scripts.launcher import LocalCluster


class ClusterStubs:
    def __init__(self, cluster: LocalCluster) -> None:
        assert cluster.router is not None
        self.cluster = cluster
        self.channel = grpc.insecure_channel(cluster.router.address)
        self.router = router_pb2_grpc.QueryRouterServiceStub(self.channel)
        self._cl: dict[str, grpc.Channel] = {}

    def commitlog(self, broker: str) -> commitlog_pb2_grpc.CommitLogServiceStub:
        addr = self.cluster.brokers[broker].commitlog.address
        if addr not in self._cl:
            self._cl[addr] = grpc.insecure_channel(addr)
        return commitlog_pb2_grpc.CommitLogServiceStub(self._cl[addr])

    def close(self) -> None:
        for ch in self._cl.values():
            ch.close()
        self.channel.close()
