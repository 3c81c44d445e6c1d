"""Bundles: topic-name hash ranges of a namespace, their ownership, load and lookup."""
