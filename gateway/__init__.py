"""The HTTP gateway: produce and consume over HTTP for users without a Pulsar client."""
