"""Every shell and Python example of README.md and docs/*.md, run as written against one
``magnetar standalone`` started for this module (what ``make run`` starts).

Proves: a reader who follows the docs top to bottom, copying each example, gets no
failure and the output the text promises. Each example is one test, in the docs'
order (README.md first, then docs/*.md by name): later examples may use what earlier
ones made, as they do for a reader. A shell example runs as one ``bash`` script with
``set -e -o pipefail``: every command must succeed, and no output may be an error
document of the gateway or the admin API (curl exits 0 on a 4xx); ``# →`` lines and
``<!-- docs-test: output -->`` blocks are checked against its standard output
(tests/docs_blocks.py has the rules). Python examples run in one interpreter (one per
file's globals, tests/docs_python_runner.py), without ``PYSPARK_PYTHON`` and without the
virtual environment on the PATH, so a Spark example works only if ``register(spark)``
gives Spark's workers the right interpreter.

What "as written" allows: the standalone runs on the documented default ports when all
of them are free, and the examples run unchanged; when one is taken (a ``make run``
beside the tests), it runs on free ports, each documented ``127.0.0.1:PORT`` in an
example is replaced by the one in use, and the ``magnetar`` commands that rely on their
defaults get ``MAGNETAR_SERVICE_URL`` / ``MAGNETAR_ADMIN_URL`` (README, "Using it").
The examples run in a fresh directory whose ``data/standalone`` is the standalone's
data directory (the README's relative paths hold), with ``.venv/bin`` first on the PATH
for shell examples (as after ``source .venv/bin/activate``). Examples that cannot run
here carry a skip marker; tests/unit/test_docs_blocks.py checks their count.

Wall time, measured 2026-12-07 on the shared 2-core machine at load average 11-25:
250-560 s, of which the two Spark examples took 156-430 s (the JVM's start 48-70 s, the
first Python workers most of the rest) and the standalone's start plus the shell
examples 45-60 s. Not measured on a quiet machine.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import signal
import time
import uuid
from pathlib import Path

import pytest

from tests.docs_blocks import Block, blocks_of, documents, find_in_order, with_ports
from spark.session import SETTINGS as SPARK_SETTINGS, SHORT_RUN_SETTINGS
from tests.cluster import python_command
from tests.integration.test_standalone import standalone_ports

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
# An example's bound. The first Spark example starts the JVM and Spark's Python workers:
# up to 290 s measured at load average 25 on the shared 2-core machine.
BLOCK_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 120.0
# The ports the README documents for `make run`, by what listens on them.
DEFAULT_PORTS = {"etcd": 2379, "peer": 2380, "bookie": 3181, "http": 8001, "broker": 6650, "broker_http": 8080,
                 "gateway": 8081, "autorecovery": 8010}
BOOKIES = 3
# An error document of the gateway ({"code", "error", "message", "retriable"}) or of the
# admin API ({"reason", ...}) in an example's output: the call failed though curl did not.
_ERROR_DOCUMENT = re.compile(r'"retriable":\s*(true|false)|\{\s*"reason":')

pytestmark = pytest.mark.timeout(900)


def _examples() -> list[Block]:
    return [block for path in documents(ROOT) for block in blocks_of(path, ROOT) if block.skip_reason is None]


def _free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _choose_ports() -> dict[str, int]:
    wanted = [port for name, port in DEFAULT_PORTS.items() if name not in ("bookie", "http")]
    wanted += [DEFAULT_PORTS["bookie"] + i for i in range(BOOKIES)] + [DEFAULT_PORTS["http"] + i for i in range(BOOKIES)]
    if all(_free(port) for port in wanted):
        return dict(DEFAULT_PORTS)
    return standalone_ports(BOOKIES)


class Docs:
    """The standalone, the directory the examples run in, and the Python runner."""

    def __init__(self, workdir: Path, ports: dict[str, int]) -> None:
        self.workdir = workdir
        self.ports = ports
        self.port_map = {DEFAULT_PORTS[name]: ports[name] for name in DEFAULT_PORTS if name not in ("bookie", "http")}
        for i in range(BOOKIES):
            self.port_map[DEFAULT_PORTS["bookie"] + i] = ports["bookie"] + i
            self.port_map[DEFAULT_PORTS["http"] + i] = ports["http"] + i
        base = {key: value for key, value in os.environ.items()
                if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
                and not key.startswith("MAGNETAR_")}
        # Without the virtual environment on the PATH, as a user running .venv/bin/python.
        plain_path = os.pathsep.join(entry for entry in base.get("PATH", "").split(os.pathsep)
                                     if entry and Path(entry).resolve() != VENV_BIN.resolve())
        # Spark's own configuration file for the machine, not the examples' text: the
        # settings every Spark test here runs with (spark/session.py: two shuffle
        # partitions on two cores, no UI, Python worker timeouts that survive a loaded
        # machine, and the short-run JVM options: C1 and the serial collector); the
        # examples set the rest themselves.
        spark_conf_dir = workdir / "spark-conf"
        spark_conf_dir.mkdir(exist_ok=True)
        (spark_conf_dir / "spark-defaults.conf").write_text("".join(
            f"{key} {value}\n" for key, value in {**SPARK_SETTINGS, **SHORT_RUN_SETTINGS}.items()
            if key not in ("spark.master", "spark.driver.host", "spark.driver.bindAddress")))
        self.python_env = {**base, "PATH": plain_path, "PYTHONPATH": str(ROOT), "SPARK_CONF_DIR": str(spark_conf_dir)}
        self.shell_env = {**base, "PATH": f"{VENV_BIN}{os.pathsep}{plain_path}",
                          "MAGNETAR_SERVICE_URL": f"pulsar://127.0.0.1:{ports['broker']}",
                          "MAGNETAR_ADMIN_URL": f"http://127.0.0.1:{ports['broker_http']}",
                          "MAGNETAR_METADATA": f"etcd://127.0.0.1:{ports['etcd']}"}
        self._runner: subprocess.Popen | None = None

    def run_shell(self, block: Block) -> tuple[int, str, str]:
        script = ("set -e -o pipefail\n"
                  "trap 'echo \"docs-test: exit $? at line $((LINENO - 2)): $BASH_COMMAND\" >&2' ERR\n"
                  + with_ports(block.code, self.port_map))
        result = subprocess.run(["bash", "-c", script], cwd=self.workdir, env=self.shell_env, capture_output=True,
                                timeout=BLOCK_TIMEOUT_S)
        return result.returncode, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")

    def run_python(self, block: Block) -> tuple[str, str | None]:
        if self._runner is None:
            self._runner = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "docs_python_runner.py")], cwd=self.workdir,
                env=self.python_env, stdin=subprocess.PIPE, stdout=open(self.workdir / "python.out", "wb"),
                stderr=subprocess.STDOUT)
        result_path = self.workdir / f"result-{uuid.uuid4().hex}.json"
        request = {"name": block.name, "namespace": block.path, "code": with_ports(block.code, self.port_map),
                   "result_path": str(result_path)}
        assert self._runner.stdin is not None
        self._runner.stdin.write((json.dumps(request) + "\n").encode())
        self._runner.stdin.flush()
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while not result_path.exists():
            assert self._runner.poll() is None, "the Python runner died:\n" + self.runner_log()
            assert time.monotonic() < deadline, f"{block.name} did not finish in {BLOCK_TIMEOUT_S} s"
            time.sleep(0.1)
        answer = json.loads(result_path.read_text())
        return answer["stdout"], answer["error"]

    def runner_log(self) -> str:
        path = self.workdir / "python.out"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        if self._runner is not None:
            assert self._runner.stdin is not None
            self._runner.stdin.close()
            try:
                self._runner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._runner.kill()
                self._runner.wait()


def _start(workdir: Path, ports: dict[str, int]) -> subprocess.Popen:
    """``magnetar standalone`` on ``ports``, its output to a file (never a pipe that
    could fill while the examples run), once it says it is ready."""
    data_dir = workdir / "data" / "standalone"
    log_path = workdir / "standalone.out"
    process = subprocess.Popen(
        python_command("standalone", "--data-dir", str(data_dir), "--etcd-port", str(ports["etcd"]),
                       "--etcd-peer-port", str(ports["peer"]), "--bookie-port-base", str(ports["bookie"]),
                       "--bookie-http-port-base", str(ports["http"]), "--broker-port", str(ports["broker"]),
                       "--broker-http-port", str(ports["broker_http"]), "--gateway-port", str(ports["gateway"]),
                       "--autorecovery-http-port", str(ports["autorecovery"])),
        stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while b"standalone ready" not in log_path.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the standalone did not start:\n" + log_path.read_text(errors="replace")[-3000:])
        time.sleep(0.2)
    return process


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("docs")
    ports = _choose_ports()
    process = _start(workdir, ports)
    docs = Docs(workdir, ports)
    try:
        yield docs
    finally:
        try:
            docs.close()
        finally:
            _stop(process)


@pytest.mark.parametrize("block", _examples(), ids=lambda block: block.name)
def test_example_runs_as_written(docs, block):
    if block.kind == "sh":
        code, stdout, stderr = docs.run_shell(block)
        assert code == 0, f"{block.name} failed (exit {code}):\n{stderr[-3000:]}\nstdout:\n{stdout[-2000:]}"
        error = _ERROR_DOCUMENT.search(stdout)
        assert error is None, f"{block.name}: a call answered an error:\n{stdout[max(0, error.start() - 500):][:1500]}"
        # A clean close of the shell's ledger client is not a broken stream (issue 39).
        assert "add stream broken" not in stderr, stderr[-3000:]
        _check_block(block, stdout)
    else:
        stdout, failure = docs.run_python(block)
        assert failure is None, f"{block.name} raised:\n{failure}\nlog:\n{docs.runner_log()}"
    missing = find_in_order(stdout, block.expectations)
    assert missing is None, f"{block.name}: the output lacks {missing!r}:\n{stdout[-4000:]}"


def _check_block(block: Block, stdout: str) -> None:
    """What a block's prose promises beyond ``# →`` lines."""
    if "magnetar perf produce" in block.code:
        # "the same count as the producer's": the throughput run's consumer drains
        # every message the producer sent (issue 39: it reported 0).
        summaries = [json.loads(line) for line in stdout.splitlines() if line.startswith("{") and '"msgs_per_s"' in line]
        assert len(summaries) == 2, stdout[-3000:]
        produced, consumed = summaries
        assert produced["messages"] > 0 and consumed["messages"] == produced["messages"], (produced, consumed)
