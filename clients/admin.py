"""The admin client: the router's four queries and its registry, with typed results.

Example:
    with AdminClient("127.0.0.1:9876") as admin:
        for m in admin.query_by_key("OrderTopic", "order-1001").messages:
            print(m.offset_msg_id, m.body)
"""
from __future__ import annotations

from typing import Any

import grpc

from quarry.channels import open_channel
from quarry.clients.errors import from_rpc_error
from quarry.clients.routers import RouterPool
from quarry.clients.model import QueryResult
from quarry.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2, indexer_pb2, indexer_pb2_grpc, router_pb2, router_pb2_grpc


# gRPC's default receive limit is 4 MiB: a browse page, or a broker's every queue and group
# (GetConsumerProgress, GetStoreStatus's segments), can be larger.
MAX_RECEIVE = [("grpc.max_receive_message_length", 128 << 20)]


class AdminClient:
    """Queries through the router; raises NotFoundError / InvalidArgumentError / UnavailableError."""

    def __init__(self, router_addr: str, timeout_s: float = 10.0, account: tuple[str, str] | None = None) -> None:
        """`router_addr`: host:port, or several routers as 'a:9876;b:9876' (tried in turn);
        `account`: (access key, secret key) signing every call instead of QUARRY_ACCESS_KEY's."""
        self.router_addr = router_addr
        self.timeout_s = timeout_s
        self.account = account
        self._routers = RouterPool(router_addr, options=MAX_RECEIVE, account=account)

    def _call(self, method: str, request: Any) -> Any:
        try:
            return self._routers.call(lambda stub: getattr(stub, method)(request, timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def query_by_key(self, topic: str, key: str, max_num: int = 64, begin: int = 0, end: int = 0, continuation_token: str = "") -> QueryResult:
        r = self._call("QueryMsgByKey", router_pb2.QueryMsgByKeyRequest(topic=topic, key=key, max_num=max_num, begin_timestamp=begin, end_timestamp=end, continuation_token=continuation_token))
        return QueryResult.from_proto(r.result)

    def query_by_unique_key(self, topic: str, unique_key: str, return_all: bool = False, begin: int = 0, end: int = 0) -> QueryResult:
        """begin/end (epoch ms) restrict the search; by default the id's window, then everything."""
        r = self._call("QueryMsgByUniqueKey", router_pb2.QueryMsgByUniqueKeyRequest(
            topic=topic, unique_key=unique_key, return_all=return_all, begin_timestamp=begin, end_timestamp=end))
        return QueryResult.from_proto(r.result)

    def query_by_id(self, offset_msg_id: str) -> QueryResult:
        r = self._call("QueryMsgById", router_pb2.QueryMsgByIdRequest(offset_msg_id=offset_msg_id))
        return QueryResult.from_proto(r.result)

    def query_by_offset(self, topic: str, broker_name: str, queue_id: int, queue_offset: int) -> QueryResult:
        r = self._call("QueryMsgByOffset", router_pb2.QueryMsgByOffsetRequest(topic=topic, broker_name=broker_name, queue_id=queue_id, queue_offset=queue_offset))
        return QueryResult.from_proto(r.result)

    def browse_topic(self, topic: str, begin: int = 0, end: int = 0, tag_expression: str = "", oldest_first: bool = False,
                     max_num: int = 0, continuation_token: str = "", broker_name: str = "", queue_id: int | None = None) -> QueryResult:
        """One page of the topic's messages stored in [begin, end] (printMsg / printMsgByQueue);
        pass result.next_token back for the next page."""
        r = self._call("BrowseTopic", router_pb2.BrowseTopicRequest(
            topic=topic, begin_timestamp=begin, end_timestamp=end, tag_expression=tag_expression, oldest_first=oldest_first,
            max_num=max_num, continuation_token=continuation_token, broker_name=broker_name,
            queue_id=queue_id or 0, has_queue_id=queue_id is not None))
        result = QueryResult.from_proto(r.result)
        result.expired = list(r.expired)
        return result

    def search_offset(self, topic: str, broker_name: str, queue_id: int, timestamp: int, upper: bool = False) -> router_pb2.SearchOffsetResponse:
        """RocketMQ's searchOffset: the first queue offset stored at or after `timestamp`
        (with upper=True: the last one at or before it)."""
        boundary = common_pb2.BOUNDARY_TYPE_UPPER if upper else common_pb2.BOUNDARY_TYPE_LOWER
        return self._call("SearchOffset", router_pb2.SearchOffsetRequest(
            topic=topic, broker_name=broker_name, queue_id=queue_id, timestamp=timestamp, boundary=boundary))

    def track(self, topic: str, broker_name: str, queue_id: int, queue_offset: int) -> list[common_pb2.GroupConsumeStatus]:
        """Each consumer group's consume status of the message stored there (TrackMessage)."""
        r = self._call("TrackMessage", router_pb2.TrackMessageRequest(topic=topic, broker_name=broker_name, queue_id=queue_id, queue_offset=queue_offset))
        return list(r.groups)

    def topic_route(self, topic: str) -> router_pb2.GetTopicRouteResponse:
        return self._call("GetTopicRoute", router_pb2.GetTopicRouteRequest(topic=topic))

    def brokers(self) -> list[router_pb2.BrokerInfo]:
        return list(self._call("ListBrokers", router_pb2.ListBrokersRequest()).brokers)

    def topics(self) -> list[str]:
        return list(self._call("ListTopics", router_pb2.ListTopicsRequest()).topics)

    def broker_status(self, commitlog_addr: str) -> commitlog_pb2.GetStoreStatusResponse:
        with open_channel(commitlog_addr, options=MAX_RECEIVE, account=self.account) as ch:
            stub = commitlog_pb2_grpc.CommitLogServiceStub(ch)
            try:
                return stub.GetStoreStatus(commitlog_pb2.GetStoreStatusRequest(), timeout=self.timeout_s)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

    def consumer_progress(self, commitlog_addr: str, topic: str = "", group: str = "") -> commitlog_pb2.GetConsumerProgressResponse:
        """One broker's queue offset ranges and each consumer group's offset and lag in them."""
        with open_channel(commitlog_addr, options=MAX_RECEIVE, account=self.account) as ch:
            try:
                return commitlog_pb2_grpc.CommitLogServiceStub(ch).GetConsumerProgress(
                    commitlog_pb2.GetConsumerProgressRequest(topic=topic, group=group), timeout=self.timeout_s)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

    def index_status(self, indexer_addr: str) -> indexer_pb2.GetIndexStatusResponse:
        """One broker's indexer: its files, how far behind the log it is, problems found."""
        with open_channel(indexer_addr, options=MAX_RECEIVE, account=self.account) as ch:
            try:
                return indexer_pb2_grpc.IndexerServiceStub(ch).GetIndexStatus(indexer_pb2.GetIndexStatusRequest(), timeout=self.timeout_s)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

    def unregister_broker(self, broker_name: str) -> None:
        """Forget a broker on every router (it stays reported missing until then)."""
        errors: list[grpc.RpcError] = []
        for address in self._routers.addresses:
            try:
                router_pb2_grpc.QueryRouterServiceStub(self._routers.channel(address)).UnregisterBroker(
                    router_pb2.UnregisterBrokerRequest(broker_name=broker_name), timeout=self.timeout_s)
            except grpc.RpcError as exc:
                errors.append(exc)
        if len(errors) == len(self._routers.addresses):
            raise from_rpc_error(errors[0])

    def close(self) -> None:
        self._routers.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
