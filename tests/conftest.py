"""Shared fixtures: one real etcd per test session (each test gets its own key root),
a per-test cluster of bookie processes that is always stopped afterwards, a per-module
cluster with a broker, and the official client on it."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest

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
        asyncio.run(cluster.start_bookies(3))
        asyncio.run(cluster.start_brokers(1))
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


def pytest_configure(config):
    # Inherited by every process the tests start: what a bookie or broker prints reaches
    # its log file at once, where the readiness checks and the failure reports read it.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report kept on the test item (``item.report_call`` …), so a fixture's
    teardown can tell that its test failed and leave evidence (the pods' logs)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


# The modules that take longest (a minute or more on the 2-core machine), longest first.
# `make test` runs files on several xdist workers (--dist loadfile --no-loadscope-reorder
# hands out whole files in collection order; by default xdist would put the files with
# the most tests first, leaving a one-test Spark module for the end): starting the long ones first keeps one worker from being left
# with a long file at the end while the others sit idle. Order only; nothing is skipped.
LONG_MODULES = (
    "test_spark_stream.py", "test_spark.py", "test_bundles.py", "test_k8s_dev.py", "test_pulsar_client.py",
    "test_archive.py", "test_security_auth.py", "test_standalone.py", "test_subscriptions.py",
    "test_retention_and_cursors.py", "test_client_features.py", "test_autorecovery.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        name = os.path.basename(str(item.fspath))
        return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)
    items.sort(key=rank)   # stable: the order within a module and among the rest stays


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
    settings are spark/session.py's, shared with `make pipeline` and the benchmark),
    with the ``magnetar`` source registered."""
    from spark.session import local_session

    session = local_session("magnetar-tests")
    yield session
    session.stop()
