"""RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`) served by Quarry's own
processes, as RocketMQ 5 runs its proxy inside the broker ("local mode"): the router answers
the access point (QueryRoute), each commitlog answers SendMessage and EndTransaction for its
own queues; both answer Telemetry, Heartbeat and NotifyClientTermination.

The plumbing both doors share, one module per concern: contract (the official generated
modules), status (in-band codes), auth (the SDKs' MQv2-HMAC-SHA1 header), sessions (client
settings and heartbeats), telemetry, client_calls, unsupported (every other RPC). The doors are
services/query/doors/rmq5_*.py and services/commitlog/doors/rmq5_*.py.
"""
