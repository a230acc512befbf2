"""The `apache.rocketmq.v2` contract, taken from the official SDK's generated modules
(PyPI `rocketmq-python-client`, package `rocketmq.grpc_protocol`), never copied here.

Importing `rocketmq.grpc_protocol` normally runs `rocketmq/__init__.py`, which starts the
whole SDK: OpenTelemetry, and a logging config that creates ~/logs/rocketmq_python/. A
server needs only the generated messages, so the package is entered without running its
`__init__` (a bare module with the package's path); the placeholder is removed again so a
later `import rocketmq` (tests, the benchmark) loads the real SDK, which then reuses these
already-loaded generated modules.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types


def _load_generated() -> types.ModuleType:
    if "rocketmq.grpc_protocol" in sys.modules:
        return sys.modules["rocketmq.grpc_protocol"]
    if "rocketmq" in sys.modules:  # the SDK is already loaded: its modules are the contract
        return importlib.import_module("rocketmq.grpc_protocol")
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("rocketmq-python-client is not installed: it provides the apache.rocketmq.v2 contract (make setup)")
    placeholder = types.ModuleType("rocketmq")
    placeholder.__path__ = list(spec.submodule_search_locations)
    sys.modules["rocketmq"] = placeholder
    try:
        return importlib.import_module("rocketmq.grpc_protocol")
    finally:
        if sys.modules.get("rocketmq") is placeholder:
            del sys.modules["rocketmq"]


_load_generated()
from rocketmq.grpc_protocol import definition_pb2 as v2  # noqa: E402
from rocketmq.grpc_protocol import service_pb2 as service  # noqa: E402
from rocketmq.grpc_protocol import service_pb2_grpc as service_grpc  # noqa: E402

SERVICE_NAME = service.DESCRIPTOR.services_by_name["MessagingService"].full_name  # apache.rocketmq.v2.MessagingService
METHOD_PREFIX = f"/{SERVICE_NAME}/"
Code = v2.Code

__all__ = ["v2", "service", "service_grpc", "SERVICE_NAME", "METHOD_PREFIX", "Code"]
