"""What every server process shares at run time: the ops HTTP endpoint, TLS contexts,
tokens, listening sockets, loop and GC monitors, task ownership and signals, the event
loop choice, command-line options for config dataclasses, eager futures and write
batches. One floor above the vocabulary (``common/``), beside ``protocol/``."""
