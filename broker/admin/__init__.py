"""The broker's HTTP side: Pulsar's admin REST paths (/admin/v2), lookups
(/lookup/v2), /health and /metrics."""
