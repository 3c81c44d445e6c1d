"""Runs the Python examples of the docs for tests/integration/test_docs.py: one process
for all of them, as a reader pasting them into one interpreter would (and one Spark JVM
for every Spark example instead of one each, which would cost 10-20 s apiece).

Protocol: one JSON request per line on stdin, ``{"name", "namespace", "code",
"result_path"}``; the example runs in the globals of its ``namespace`` (one per
Markdown file), with what it prints captured; the answer ``{"stdout", "error"}`` is
written to ``result_path`` (not to stdout: the official client's and Spark's native
logs write to file descriptors 1 and 2). EOF ends the process.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def main() -> int:
    namespaces: dict[str, dict] = {}
    for line in sys.stdin:
        request = json.loads(line)
        scope = namespaces.setdefault(request["namespace"], {"__name__": "__main__"})
        captured = io.StringIO()
        error = None
        try:
            with contextlib.redirect_stdout(captured):
                exec(compile(request["code"], request["name"], "exec"), scope)   # noqa: S102 - the docs' own examples
        except BaseException:  # noqa: BLE001 - reported to the test, which fails
            error = traceback.format_exc()
        with open(request["result_path"], "w", encoding="utf-8") as handle:
            json.dump({"stdout": captured.getvalue(), "error": error}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
