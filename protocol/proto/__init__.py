"""Generated protobuf and gRPC code (``make proto`` builds it from the ``.proto`` files here)."""
