"""Quarry: the services, clients, formats and pipeline (quarry.services, quarry.clients,
quarry.formats, quarry.pipeline), the gRPC plumbing both services and clients use
(quarry.channels, quarry.signing) and the generated protobuf code (quarry.v1, built by
`scripts/gen_protos.py`)."""
