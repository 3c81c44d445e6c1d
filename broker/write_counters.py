"""What the broker's client connections write: frames queued and the sends that carried
them (broker/connection.py coalesces one turn of the loop's frames into one send). Shown
in /metrics; frames over sends is what the coalescing saves."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class WriteCounters:
    frames: int = 0      # write_command / write_buffers calls (a command, or a message's frames)
    sends: int = 0       # hand-overs to the transport (one send system call when it is drained)
