"""``magnetar proxy``: the front door for clients that cannot reach brokers' addresses
(docs/proxy.md)."""
