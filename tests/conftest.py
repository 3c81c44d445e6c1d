"""Shared fixtures: one real etcd per test session (each test gets its own key root),
a per-test cluster of bookie processes that is always stopped afterwards, a per-module
cluster with a broker, and the official client on it."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest

from tests import worker_crashes
from tests.cluster import Cluster, EtcdProcess


@pytest.fixture(scope="session")
def etcd_process():
    base_dir = tempfile.mkdtemp(prefix="magnetar-etcd-")
    etcd = EtcdProcess(base_dir)
    etcd.start()
    yield etcd
    etcd.kill9()
    shutil.rmtree(base_dir, ignore_errors=True)


@pytest.fixture
async def cluster(etcd_process, tmp_path):
    cluster = Cluster(etcd_process, str(tmp_path))
    yield cluster
    await cluster.stop()


@pytest.fixture(scope="module")
def pulsar_cluster(etcd_process, tmp_path_factory):
    """etcd + 3 bookies + 1 broker shared by the tests of one module (each test uses
    its own topics). Yields the Cluster; ``cluster.brokers[0].service_url`` is the
    pulsar:// URL and ``.web_service_url`` the admin URL. Synchronous, so the tests
    using it may be plain functions driving the (threaded) official client."""
    cluster = Cluster(etcd_process, str(tmp_path_factory.mktemp("pulsar-cluster")))
    try:
        # Inside the try: a broker that fails to start must not leave the bookies running.
        # Side by side: a broker needs no bookie until its first ledger, after this.
        async def start() -> None:
            await asyncio.gather(cluster.start_bookies(3), cluster.start_brokers(1))

        asyncio.run(start())
        yield cluster
    finally:
        asyncio.run(cluster.stop())


@pytest.fixture(scope="module")
def client(pulsar_cluster):
    """The official client, connected to the module's broker, shared by its tests."""
    import pulsar  # here, so that the unit tests never load the client

    client = pulsar.Client(pulsar_cluster.brokers[0].service_url, operation_timeout_seconds=30)
    yield client
    client.close()


@pytest.fixture
def metadata_url(etcd_process) -> str:
    import uuid

    return etcd_process.url(f"/test-{uuid.uuid4().hex[:12]}")


@pytest.hookimpl(trylast=True)   # after pytest's own faulthandler, which worker_crashes replaces
def pytest_configure(config):
    worker_crashes.enable_in_worker(config)
    # Inherited by every process the tests start: what a bookie or broker prints reaches
    # its log file at once, where the readiness checks and the failure reports read it.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    # Every bookie, broker and gateway a test starts times its event loop every 100 ms
    # instead of every 10 ms (runtime/loop_monitor.py): idle servers are most of what a
    # run keeps alive, and at 10 ms each monitor took about 1 % of a core.
    os.environ.setdefault("MAGNETAR_LOOP_MONITOR_INTERVAL_S", "0.1")


def pytest_unconfigure(config):
    worker_crashes.close_in_worker()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A test whose worker died: its report gets the worker's stacks
    (tests/worker_crashes.py says why)."""
    worker_crashes.handle_crash(crashitem, report)


def pytest_terminal_summary(terminalreporter):
    worker_crashes.summarize(terminalreporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report kept on the test item (``item.report_call`` …), so a fixture's
    teardown can tell that its test failed and leave evidence (the pods' logs)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


# The modules that take longest (ten seconds or more on the 2-core machine), longest first.
# `make test` runs files on several xdist workers (--dist loadfile --no-loadscope-reorder
# hands out whole files in this order; by default xdist would put the files with the
# most tests first, leaving a one-test Spark module for the end): starting the long ones
# first keeps one worker from being left with a long file at the end while the others
# sit idle. Order only; nothing is skipped. The two Spark modules run on one worker, one
# after the other, so the run starts one Spark JVM, not two: a worker needs two tests in
# hand to run one, so the one-test test_spark_stream.py is given the fourth module at
# once, and test_spark.py is that fourth.
LONG_MODULES = (
    "integration/test_spark_stream.py", "hosts/test_hosts.py", "integration/test_bundles.py", "integration/test_k8s_dev.py",
    "integration/test_spark.py", "integration/test_archive.py", "integration/test_standalone.py",
    "integration/test_subscriptions.py", "integration/test_retention_and_cursors.py",
    "integration/test_autorecovery.py", "integration/test_ledger_client.py",
    "integration/test_security_auth.py", "integration/test_gateway_bad_input.py",
    "integration/test_gateway.py", "integration/test_bookie_service.py",
    "integration/test_client_features.py", "integration/test_cli_tools.py",
    "integration/test_shell_durability.py", "integration/test_metadata_outage.py",
    "integration/test_ports_in_use.py", "integration/test_broker_bad_input.py",
    "integration/test_standalone_supervision.py", "sim/test_simulation.py",
    "integration/test_client_features_restart.py", "integration/test_ledger_gc.py",
    "integration/test_security_tls.py", "integration/test_pulsar_client.py",
    "integration/test_bookie_disks.py", "integration/test_client.py", "integration/test_admin_rest.py",
    "integration/test_k8s_secured.py", "unit/test_cursor.py", "integration/test_security_standalone.py",
    "integration/test_fanout.py", "unit/test_k8s_manifests.py", "integration/test_standalone_children.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        path = str(item.fspath).replace(os.sep, "/")
        name = "/".join(path.rsplit("/", 2)[-2:])      # integration/test_bundles.py, not unit/…
        return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)
    items.sort(key=rank)   # stable: the order within a module and among the rest stays


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the next module handed to a worker only once it is waiting
    for one. xdist's own gives a worker its next module as soon as two of its tests are
    left, so a long module could sit behind a running one's last two (a minute, for some)
    while another worker went idle. A worker runs a test only once it holds the one after
    (its fixtures' teardown depends on it), so one test pending means it is waiting.
    Order only: every test still runs, each module whole on one worker. (xdist's
    scheduler internals: pyproject.toml keeps pytest-xdist below 4.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class JustInTimeFileScheduling(LoadFileScheduling):
        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    return JustInTimeFileScheduling(config, log)


@pytest.fixture(autouse=True)
def _official_clients_are_closed(request):
    """Every official ``pulsar.Client`` a test makes is closed when the test ends, even
    when the test failed before its own ``close``. A client left open is destroyed at
    interpreter exit with its C++ threads still joinable, and the process aborts
    ("terminate called without an active exception", exit 134) after every test has
    passed: ``make test`` would fail for a leak, not a defect. Tests of modules that
    never import the client pay nothing."""
    import sys

    pulsar = sys.modules.get("pulsar")
    if pulsar is None and "integration" not in str(request.node.fspath):
        yield
        return
    import pulsar

    made: list = []
    original_init = pulsar.Client.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        made.append(self)

    pulsar.Client.__init__ = recording_init
    try:
        yield
    finally:
        pulsar.Client.__init__ = original_init
        for client in made:
            try:
                client.close()
            except Exception:   # already closed by the test: nothing to do
                pass


@pytest.fixture(scope="session")
def spark_session():
    """One local SparkSession for the whole run (its JVM starts in ~15-30 s; the
    settings are spark/session.py's, shared with `make pipeline` and the benchmark,
    plus its SHORT_RUN_SETTINGS: C1 and the serial collector, half the JVM's CPU),
    with the ``magnetar`` source registered."""
    from spark.session import SHORT_RUN_SETTINGS, local_session

    session = local_session("magnetar-tests", SHORT_RUN_SETTINGS)
    yield session
    session.stop()
