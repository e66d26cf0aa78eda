"""Generated protobuf/gRPC code (do not edit; run proto/generate.py)."""
