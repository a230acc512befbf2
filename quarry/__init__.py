"""Generated protobuf code for Quarry's contracts (quarry.v1). Built by `scripts/gen_protos.py`."""
