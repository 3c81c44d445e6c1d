"""Generated gRPC code for the bookie service (``make proto`` builds it from bookie.proto)."""
