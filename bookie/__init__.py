"""The storage tier: a bookie stores entries of many ledgers on a journal disk (WAL,
group-committed fsync) and ledger disks (entry logs + index). See docs/architecture.md."""
