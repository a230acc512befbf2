"""The wire contracts: every service and RPC exists with its types, everything is documented, buf lint passes."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from quarry.v1 import commitlog_pb2, common_pb2, indexer_pb2, router_pb2

REPO = Path(__file__).resolve().parents[2]
FILES: list[FileDescriptor] = [common_pb2.DESCRIPTOR, commitlog_pb2.DESCRIPTOR, indexer_pb2.DESCRIPTOR, router_pb2.DESCRIPTOR]

EXPECTED_RPCS = {
    "quarry.v1.CommitLogService": {
        "SendMessage": ("SendMessageRequest", "SendMessageResponse", False, False),
        "SendBatch": ("SendBatchRequest", "SendBatchResponse", False, False),
        "SendStream": ("SendStreamRequest", "SendStreamResponse", True, False),
        "ViewMessage": ("ViewMessageRequest", "ViewMessageResponse", False, False),
        "GetMessages": ("GetMessagesRequest", "GetMessagesResponse", False, False),
        "PullMessages": ("PullMessagesRequest", "PullMessagesResponse", False, False),
        "Tail": ("TailRequest", "TailResponse", False, True),
        "GetStoreStatus": ("GetStoreStatusRequest", "GetStoreStatusResponse", False, False),
        "SearchOffsetByTime": ("SearchOffsetByTimeRequest", "SearchOffsetByTimeResponse", False, False),
        "BrowseMessages": ("BrowseMessagesRequest", "BrowseMessagesResponse", False, False),
        "ConsumeStatus": ("ConsumeStatusRequest", "ConsumeStatusResponse", False, False),
        "GetConsumerProgress": ("GetConsumerProgressRequest", "GetConsumerProgressResponse", False, False),
    },
    "quarry.v1.IndexerService": {
        "QueryMessage": ("QueryMessageRequest", "QueryMessageResponse", False, False),
        "GetIndexStatus": ("GetIndexStatusRequest", "GetIndexStatusResponse", False, False),
        "WatchKeyPresence": ("WatchKeyPresenceRequest", "WatchKeyPresenceResponse", False, True),
    },
    "quarry.v1.QueryRouterService": {
        "RegisterBroker": ("RegisterBrokerRequest", "RegisterBrokerResponse", False, False),
        "UnregisterBroker": ("UnregisterBrokerRequest", "UnregisterBrokerResponse", False, False),
        "GetTopicRoute": ("GetTopicRouteRequest", "GetTopicRouteResponse", False, False),
        "ListBrokers": ("ListBrokersRequest", "ListBrokersResponse", False, False),
        "ListTopics": ("ListTopicsRequest", "ListTopicsResponse", False, False),
        "QueryMsgByKey": ("QueryMsgByKeyRequest", "QueryMsgByKeyResponse", False, False),
        "QueryMsgByUniqueKey": ("QueryMsgByUniqueKeyRequest", "QueryMsgByUniqueKeyResponse", False, False),
        "QueryMsgById": ("QueryMsgByIdRequest", "QueryMsgByIdResponse", False, False),
        "QueryMsgByOffset": ("QueryMsgByOffsetRequest", "QueryMsgByOffsetResponse", False, False),
        "BrowseTopic": ("BrowseTopicRequest", "BrowseTopicResponse", False, False),
        "SearchOffset": ("SearchOffsetRequest", "SearchOffsetResponse", False, False),
        "TrackMessage": ("TrackMessageRequest", "TrackMessageResponse", False, False),
    },
}

STORED_MESSAGE_FIELDS = {
    "topic", "flag", "body", "properties", "keys", "tags", "unique_key", "queue_id", "queue_offset",
    "commit_log_offset", "store_size", "sys_flag", "born_timestamp", "born_host", "store_timestamp",
    "store_host", "reconsume_times", "prepared_transaction_offset", "body_crc", "offset_msg_id", "broker_name",
}


def test_all_files_share_the_versioned_package() -> None:
    assert {fd.package for fd in FILES} == {"quarry.v1"}


@pytest.mark.parametrize("service", sorted(EXPECTED_RPCS))
def test_service_has_every_rpc_with_documented_types(service: str) -> None:
    fd = next(f for f in FILES if any(s.full_name == service for s in f.services_by_name.values()))
    desc = next(s for s in fd.services_by_name.values() if s.full_name == service)
    methods = {m.name: m for m in desc.methods}
    assert set(methods) == set(EXPECTED_RPCS[service])
    for name, (req, resp, client_stream, server_stream) in EXPECTED_RPCS[service].items():
        m = methods[name]
        assert m.input_type.name == req, name
        assert m.output_type.name == resp, name
        proto = descriptor_pb2.MethodDescriptorProto()
        m.CopyToProto(proto)
        assert proto.client_streaming == client_stream, name
        assert proto.server_streaming == server_stream, name


def test_stored_message_carries_every_message_ext_field() -> None:
    fields = set(common_pb2.StoredMessage.DESCRIPTOR.fields_by_name)
    assert STORED_MESSAGE_FIELDS <= fields


def test_query_results_carry_per_broker_outcomes_and_complete_flag() -> None:
    fields = router_pb2.QueryResult.DESCRIPTOR.fields_by_name
    assert fields["brokers"].message_type.name == "BrokerOutcome"
    assert "complete" in fields


def _descriptor_set_with_comments(tmp_path: Path) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc
    import grpc_tools

    out = tmp_path / "set.pb"
    protos = sorted(str(p.relative_to(REPO / "protos")) for p in (REPO / "protos" / "quarry" / "v1").glob("*.proto"))
    rc = protoc.main([
        "protoc", f"-I{REPO / 'protos'}", f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
        "--include_source_info", f"--descriptor_set_out={out}", *protos,
    ])
    assert rc == 0
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(out.read_bytes())
    return fds


def test_every_service_rpc_message_field_and_enum_value_has_a_comment(tmp_path: Path) -> None:
    fds = _descriptor_set_with_comments(tmp_path)
    missing: list[str] = []
    for f in fds.file:
        comments = {tuple(loc.path): loc.leading_comments.strip() for loc in f.source_code_info.location}
        for si, svc in enumerate(f.service):
            if not comments.get((6, si)):
                missing.append(svc.name)
            for mi, m in enumerate(svc.method):
                if not comments.get((6, si, 2, mi)):
                    missing.append(f"{svc.name}.{m.name}")
        for mi, msg in enumerate(f.message_type):
            if not comments.get((4, mi)):
                missing.append(msg.name)
            for fi, fld in enumerate(msg.field):
                if not comments.get((4, mi, 2, fi)):
                    missing.append(f"{msg.name}.{fld.name}")
        for ei, enum in enumerate(f.enum_type):
            if not comments.get((5, ei)):
                missing.append(enum.name)
            for vi, val in enumerate(enum.value):
                if not comments.get((5, ei, 2, vi)):
                    missing.append(f"{enum.name}.{val.name}")
    assert not missing, f"undocumented: {missing}"


def test_rpc_comments_name_their_error_codes(tmp_path: Path) -> None:
    """Every RPC that takes input documents what bad input or a missing message returns."""
    fds = _descriptor_set_with_comments(tmp_path)
    for f in fds.file:
        comments = {tuple(loc.path): loc.leading_comments for loc in f.source_code_info.location}
        for si, svc in enumerate(f.service):
            for mi, m in enumerate(svc.method):
                if m.input_type.endswith(("GetStoreStatusRequest", "GetIndexStatusRequest", "ListBrokersRequest", "ListTopicsRequest")):
                    continue
                text = comments[(6, si, 2, mi)]
                named = {c.name for c in grpc.StatusCode if c is not grpc.StatusCode.OK and re.search(rf"\b{c.name}\b", text)}
                assert named, f"{svc.name}.{m.name}: its comment names no error status code"


def _buf() -> str:
    candidate = Path(sys.executable).parent / "buf"
    return str(candidate) if candidate.exists() else (shutil.which("buf") or "buf")


def test_buf_lint_passes() -> None:
    result = subprocess.run([_buf(), "lint"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


RELEASED = REPO / "protos" / "quarry.v1.binpb"  # the released contract; `make release-contract` rewrites it


def _breaking(module: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_buf(), "breaking", "--against", str(RELEASED)], cwd=module, capture_output=True, text=True, timeout=180)


def test_buf_breaking_against_the_released_contract() -> None:
    """protos/ may only grow (buf FILE rules) beyond the committed image of the released contract.

    The image is a file in the tree, so a depth-1 clone checks exactly what a full one does."""
    assert RELEASED.is_file(), f"{RELEASED} is missing: run `make release-contract` when a contract is released"
    result = _breaking(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_released_image_is_the_quarry_v1_package() -> None:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(RELEASED.read_bytes())
    ours = {f.name for f in fds.file if f.package == "quarry.v1"}
    assert ours and ours <= {f"quarry/v1/{p.name}" for p in (REPO / "protos" / "quarry" / "v1").glob("*.proto")}


def _module_copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "protos" / "quarry", tmp_path / "protos" / "quarry")
    shutil.copy(REPO / "buf.yaml", tmp_path / "buf.yaml")
    return tmp_path


def test_additions_pass_and_a_removal_fails_against_the_released_image(tmp_path: Path) -> None:
    module = _module_copy(tmp_path)
    common = module / "protos" / "quarry" / "v1" / "common.proto"
    text = common.read_text()
    added = text + """
// Added after the release: a new message is not a breaking change.
message ReleaseProbe {
  // A new field.
  string note = 1;
}
"""
    common.write_text(added)
    assert _breaking(module).returncode == 0
    removed = re.sub(r"\n  int32 body_crc = 19;\n", "\n", text, count=1)
    assert removed != text
    common.write_text(removed)
    result = _breaking(module)
    assert result.returncode == 100 and "body_crc" in result.stdout + result.stderr, result.stdout + result.stderr  # 100: breaking
