"""tests/worker_crashes.py at work: a real pytest run on two xdist workers, one of
whose tests kills its worker with SIGSEGV."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.conftest import (pytest_configure, pytest_handlecrashitem, pytest_report_teststatus,
                            pytest_terminal_summary, pytest_unconfigure)
"""

CRASHING = """
import ctypes, os
from pathlib import Path

def test_crashes(request):
    flag = Path(os.environ["CRASH_FLAG"])
    if os.environ.get("CRASH_ALWAYS") or not flag.exists():
        flag.write_text("crashed")
        ctypes.string_at(0)      # SIGSEGV in C, as a client library's bug would

def test_after_it():
    pass
"""


def _run(tmp_path: Path, always: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_crashing.py").write_text(textwrap.dedent(CRASHING))
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CRASH_FLAG": str(tmp_path / "flag"),
           "CRASH_ALWAYS": "1" if always else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadfile",
         "--max-worker-restart", "1", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_first_crash_is_reported_with_the_stacks_and_run_once_more(tmp_path):
    result = _run(tmp_path, always=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed, 1 rerun" in result.stdout, result.stdout
    assert "tests that crashed their worker and were run once more" in result.stdout
    assert "test_crashing.py::test_crashes" in result.stdout
    assert "Fatal Python error: Segmentation fault" in result.stdout   # the worker's dump
    assert "in test_crashes" in result.stdout                          # its stack names the test


def test_a_test_that_crashes_again_fails(tmp_path):
    result = _run(tmp_path, always=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED test_crashing.py::test_crashes" in result.stdout, result.stdout
    assert "1 rerun" in result.stdout
