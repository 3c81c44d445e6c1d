"""The ledger client: create, write, read, recover and delete ledgers on bookies, with
ensembles, write and ack quorums, fencing and ensemble changes (BookKeeper-style)."""
