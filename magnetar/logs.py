"""Logging set-up shared by every process: one line per event, either
``time level logger message`` text or one JSON object per line (``--log-format json``),
so that log shippers can parse them. Messages carry ``key=value`` pairs themselves."""

from __future__ import annotations

import json
import logging
import sys
import time


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document)


def configure(level: str = "info", log_format: str = "text", *, process: str = "") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        prefix = f"{process} " if process else ""
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s.%(msecs)03d %(levelname)s {prefix}%(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # grpc and aiohttp access logs are per request: keep them out of info.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
