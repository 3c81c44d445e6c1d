"""tests/worker_crashes.py at work: a real pytest run on two xdist workers, one of
whose tests kills its worker with SIGSEGV (once: the flag file it leaves stops the next)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.conftest import pytest_configure, pytest_handlecrashitem, pytest_terminal_summary, pytest_unconfigure
"""

CRASHING = """
import ctypes, os
from pathlib import Path

def test_crashes(request):
    flag = Path(os.environ["CRASH_FLAG"])
    if not flag.exists():
        flag.write_text("crashed")
        ctypes.string_at(0)      # SIGSEGV in C, as a client library's bug would

def test_after_it():
    pass
"""


def _run(tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_crashing.py").write_text(textwrap.dedent(CRASHING))
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CRASH_FLAG": str(tmp_path / "flag")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadfile",
         "--max-worker-restart", "1", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_crash_fails_the_test_with_the_worker_s_stacks_and_the_run_goes_on(tmp_path):
    result = _run(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED test_crashing.py::test_crashes" in result.stdout, result.stdout
    # xdist runs the rest of the module again on the replacement worker, the crashed
    # test too (it passes then: the crash happens once), but the crash stays a failure.
    assert "1 failed, 3 passed" in result.stdout, result.stdout
    assert "tests whose worker died (with the worker's stacks)" in result.stdout
    assert "Fatal Python error: Segmentation fault" in result.stdout   # the worker's dump
    assert "in test_crashes" in result.stdout                          # its stack names the test
