"""The Kubernetes manifests of k8s/ as the tests see them: rendered by ``kubectl kustomize``
(the kubectl wheel that ``make setup`` installs), parsed, and each pod's container turned
into what the kubelet would run — its command line and its environment, resolved the way
Kubernetes resolves them (fieldRef, configMapKeyRef, secretKeyRef, ``$(VAR)`` references
to variables defined earlier in the list).
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
OVERLAYS = ("dev", "prod")
# Kubernetes minor versions every rendered object must validate against (kubernetes-validate
# --strict): the three newest the installed kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
# The namespace the overlays set; what metadata.namespace resolves to.
NAMESPACE = "magnetar"
WORKLOAD_KINDS = ("StatefulSet", "Deployment")
_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


def tool(name: str) -> str:
    """A command-line tool of the virtual environment (kubectl, kubernetes-validate, etcdctl)."""
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    assert found, f"{name} not found: run make setup"
    return found


@functools.lru_cache(maxsize=None)   # the files do not change during a test run
def render_text(overlay: str) -> str:
    result = subprocess.run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(overlay: str) -> list[dict]:
    return [document for document in yaml.safe_load_all(render_text(overlay)) if document]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name, len(matches))
    return matches[0]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def component(workload: dict) -> str:
    return workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined
    reference stays as written, ``$$`` is one ``$``."""
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables[name] if name in variables else match.group(0)

    return _VAR_REFERENCE.sub(replace, text)


def _config_value(objects: list[dict], kind: str, name: str, key: str) -> str:
    source = named(objects, kind, name)
    if kind == "Secret":
        if key in source.get("stringData", {}):
            return source["stringData"][key]
        return base64.b64decode(source["data"][key]).decode()
    return source["data"][key]


def resolve_env(container: dict, objects: list[dict], *, pod_name: str, pod_ip: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (in list order)."""
    resolved: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            resolved[item["name"]] = expand(str(item["value"]), resolved)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            field_path = source["fieldRef"]["fieldPath"]
            value = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE, "status.podIP": pod_ip}[field_path]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            value = _config_value(objects, "ConfigMap", ref["name"], ref["key"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            if ref.get("optional") and not [o for o in objects if o["kind"] == "Secret"
                                            and o["metadata"]["name"] == ref["name"]]:
                continue        # an optional Secret the operator did not create: unset
            value = _config_value(objects, "Secret", ref["name"], ref["key"])
        else:
            raise AssertionError(f"unsupported valueFrom: {source}")
        resolved[item["name"]] = value
    return resolved


def command_line(container: dict, env: dict[str, str]) -> list[str]:
    """command + args with ``$(VAR)`` expanded (what the kubelet executes)."""
    return [expand(token, env) for token in [*container.get("command", []), *container.get("args", [])]]


def pre_stop_command(container: dict, env: dict[str, str]) -> list[str] | None:
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return None
    assert "exec" in hook, f"only exec preStop hooks are used: {hook}"
    return [expand(token, env) for token in hook["exec"]["command"]]


@dataclass
class Pod:
    """One pod a workload would create: its name, its template, its ordinal."""
    name: str
    workload: dict
    ordinal: int

    @property
    def spec(self) -> dict:
        return self.workload["spec"]["template"]["spec"]

    @property
    def component(self) -> str:
        return component(self.workload)

    @property
    def container(self) -> dict:
        containers = self.spec["containers"]
        assert len(containers) == 1, "one container per pod"
        return containers[0]


def pod_name(workload: dict, ordinal: int) -> str:
    """StatefulSet pods are name-N; a Deployment's get a random suffix, here a fixed one."""
    name = workload["metadata"]["name"]
    return f"{name}-{ordinal}" if workload["kind"] == "StatefulSet" else f"{name}-{ordinal:05d}"


def pods(workload: dict, count: int | None = None) -> list[Pod]:
    count = workload["spec"]["replicas"] if count is None else count
    return [Pod(pod_name(workload, i), workload, i) for i in range(count)]
