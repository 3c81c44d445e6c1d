"""What `make test` does when an xdist worker process dies in the middle of a test.

The official ``pulsar-client`` is C++ under its Python skin, and it has crashed a test
process in this project's history (a SIGSEGV once in a benchmark, twice in
test_client_features.py under a loaded machine): the library's own tracker lists
segfaults on close and on timers firing after close. A worker that dies that way takes
its test with it, and xdist reports the test failed with nothing but "worker crashed".

So every worker writes its Python stacks (all threads) to a file of its own when it
gets a fatal signal (``faulthandler``), and the report of the crashed test carries that
file's content (also listed at the end of the run), so the crash can be traced to the
library or to our code. The test still fails: nothing is rerun. (A rerun of the
crashed test, tried first, left a run with the project's scheduler hanging once after
the crash: not worth a CI run that never ends.)
"""

from __future__ import annotations

import faulthandler
import tempfile
from pathlib import Path

_DUMP_BYTES_MAX = 20_000   # enough for every thread's stack of a pytest worker

_dump_file = None   # the worker's open dump file: faulthandler writes to its descriptor


def dump_path(testrunuid: str, workerid: str) -> Path:
    return Path(tempfile.gettempdir()) / f"magnetar-test-faults-{testrunuid}" / f"{workerid}.log"


def enable_in_worker(config) -> None:
    """In an xdist worker: fatal signals dump every thread's stack to the worker's file
    (appended to, so a replacement worker of the same id keeps what its predecessor
    wrote)."""
    global _dump_file
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    path = dump_path(workerinput["testrunuid"], workerinput["workerid"])
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump_file = open(path, "a", encoding="utf-8")   # noqa: SIM115 (open for the worker's life)
    faulthandler.enable(file=_dump_file, all_threads=True)


def _read_dump(node) -> str:
    workerinput = getattr(node, "workerinput", None) or {}
    path = dump_path(workerinput.get("testrunuid", "?"), workerinput.get("workerid", "?"))
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return f"(no fault dump at {path}: {exc.strerror})"
    _remove(path)   # read: the worker that replaces the dead one starts a new file
    return text[-_DUMP_BYTES_MAX:] if text.strip() else f"(the fault dump at {path} is empty: the worker died without a fatal signal Python could catch, e.g. SIGKILL)"


def handle_crash(crashitem: str, report) -> None:
    """The crash report gets the worker's stacks (the test stays failed)."""
    node = getattr(report, "node", None)
    report.longrepr = f"{report.longrepr}\n\nthe worker's stacks at the fatal signal:\n{_read_dump(node)}"
    _crashed.append((crashitem, str(report.longrepr)))


_crashed: list[tuple[str, str]] = []


def summarize(terminalreporter) -> None:
    if not _crashed:
        return
    terminalreporter.section("tests whose worker died (with the worker's stacks)", sep="=")
    for nodeid, text in _crashed:
        terminalreporter.write_line(f"{nodeid}:")
        terminalreporter.write_line(text)


def close_in_worker() -> None:
    """A worker that ends normally removes its (empty) dump file, and the run's
    directory once no other worker's file is left in it."""
    global _dump_file
    if _dump_file is None:
        return
    faulthandler.disable()
    path = Path(_dump_file.name)
    _dump_file.close()
    _dump_file = None
    _remove(path)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:   # another worker's file is still there
        pass
