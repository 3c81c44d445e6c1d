"""A Spark standalone cluster for tests: a master and workers started with pyspark's own
``spark-class`` (org.apache.spark.deploy.master.Master / …worker.Worker) on free
loopback ports, small JVMs (the daemons 192 MiB, each worker offering one core and
768 MiB to executors), each worker with a work directory of its own (an executor
runs there, so its tasks' working directory says which worker ran them).

Workers get the environment a host of the cluster would have (``worker_env``: the
object store's credentials, as an instance role or a credentials file would give
them), and ``PYSPARK_PYTHON`` is this interpreter, which has the project.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from tests.cluster import ManagedProcess, free_port

READY_TIMEOUT_S = 240.0


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


class SparkStandalone:
    def __init__(self, base_dir: str, workers: int = 2, worker_env: dict[str, str] | None = None) -> None:
        self.base_dir = base_dir
        home = spark_home()
        spark_class = os.path.join(home, "bin", "spark-class")
        self.master_port = free_port()
        self.master_ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.master_port}"
        env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "192m",
               "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": sys.executable,
               "SPARK_LOG_DIR": os.path.join(base_dir, "spark-logs")}
        self.master = ManagedProcess("spark-master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
            os.path.join(base_dir, "spark-master.log"))
        self.master.env = env
        self.workers: list[ManagedProcess] = []
        self.work_dirs: list[str] = []
        for index in range(workers):
            work_dir = os.path.join(base_dir, f"spark-worker-{index}")
            os.makedirs(work_dir, exist_ok=True)
            worker = ManagedProcess(f"spark-worker-{index}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "1", "--memory", "768m",
                "--work-dir", work_dir, self.master_url], os.path.join(base_dir, f"spark-worker-{index}.log"))
            worker.env = {**env, **(worker_env or {})}
            self.workers.append(worker)
            self.work_dirs.append(work_dir)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui_port}/json/", timeout=10) as answer:
            return json.load(answer)

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):       # not up yet (its UI answers HTML while starting)
            return 0

    def start(self) -> "SparkStandalone":
        self.master.spawn()
        for worker in self.workers:
            worker.spawn()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.alive_workers() < len(self.workers):
            for process in (self.master, *self.workers):
                if not process.running:
                    raise RuntimeError(f"{process.name} exited:\n{process.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"spark workers not registered in {READY_TIMEOUT_S}s:\n"
                                   f"{self.master.log_text()[-3000:]}")
            time.sleep(1)
        return self

    def kill_worker(self, index: int) -> None:
        """kill -9 of a worker and the executors it started (its process group)."""
        self.workers[index].kill9()

    def stop(self) -> None:
        for process in (*self.workers, self.master):
            process.kill9()
