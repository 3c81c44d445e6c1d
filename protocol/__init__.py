"""Wire formats: the Pulsar binary protocol (frame codec, commands, batches, the
``.proto``) and the bookie's gRPC ``.proto``. Pure: no sockets, no event loop."""
