"""quarry.v1 generated stubs: *_pb2.py, *_pb2_grpc.py and their .pyi type stubs (never edited)."""
