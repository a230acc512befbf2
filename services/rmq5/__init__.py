"""RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`) served by Quarry's own
processes, as RocketMQ 5 runs its proxy inside the broker ("local mode"): the router answers
the access point (QueryRoute), each commitlog answers SendMessage and EndTransaction for its
own queues; both answer Telemetry, Heartbeat and NotifyClientTermination.

One module per concern: contract (the official generated modules), status (in-band codes),
auth (the SDKs' MQv2-HMAC-SHA1 header), sessions (client settings and heartbeats), telemetry,
route, send (SDK message → RocketMQ record), transaction (half records), unsupported (every
other RPC), and the two servicers (router_servicer, commitlog_servicer) that only wire them.
"""
