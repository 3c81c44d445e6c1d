"""Protobuf definitions of the Pulsar binary protocol subset the broker speaks; the
*_pb2 modules are generated from them by `make proto`."""
