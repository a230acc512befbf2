"""grpc.aio's poller thread, run under Linux's SCHED_BATCH policy.

grpc.aio reads gRPC's completions on a thread of its own (`PollerCompletionQueue._poll_wrapper`)
and hands them to the event loop through a socket. Under the normal policy that thread, woken
by each completion, preempts the loop on its core: a send at 16 in flight cost ~5 involuntary
switches of the loop, each with the caches refilled after it. As a batch thread it does not
preempt on wake-up: it runs when a core is free (the loop waiting, or the other core idle)
and hands over every completion that arrived meanwhile at once. The commitlog's CPU per
RocketMQ 5 send fell from ~205 to ~170 us (see bench/HISTORY.md). A thread's own policy needs
no privilege; the loop and every other thread keep theirs.
"""
from __future__ import annotations

import os
import threading

POLICIES = ("batch", "normal")


def poller_threads() -> list[threading.Thread]:
    """The threads grpc.aio polls its completion queue on (one per process once grpc.aio has
    made a server or a channel)."""
    from grpc._cython import cygrpc

    kind = getattr(cygrpc, "PollerCompletionQueue", None)
    if kind is None:  # a grpc without the poller thread: nothing to schedule
        return []
    return [t for t in threading.enumerate() if isinstance(getattr(getattr(t, "_target", None), "__self__", None), kind)]


def apply(policy: str) -> str:
    """Give grpc.aio's poller thread `policy` ("batch" or "normal"); what was done, in words
    (logged once at start). Call after grpc.aio made its first server or channel. It holds for
    the poller thread running now: one grpc.aio starts again after every server and channel
    closed runs under the normal policy (a service keeps its server for its whole life), and
    "normal" leaves a thread as it is rather than undoing an earlier "batch"."""
    if policy not in POLICIES:
        raise ValueError(f"poller policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "normal":
        return "normal"
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        return "normal (no SCHED_BATCH on this platform)"
    threads = [t for t in poller_threads() if t.native_id is not None]
    if not threads:
        return "normal (no grpc.aio poller thread found)"
    for t in threads:
        try:
            os.sched_setscheduler(t.native_id, batch, os.sched_param(0))  # type: ignore[arg-type]
        except OSError as exc:  # a sandbox may refuse it: the service runs on, as before
            return f"normal (SCHED_BATCH refused: {exc.strerror or exc})"
    return "batch"
