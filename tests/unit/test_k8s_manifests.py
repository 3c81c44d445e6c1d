"""The Kubernetes manifests (k8s/) cannot drift from the code.

What it proves, on the objects ``kubectl kustomize`` renders for every overlay: each passes
``kubernetes-validate --strict`` for three Kubernetes minor versions; the overlays have the
sizes they promise; every container has liveness and readiness probes on paths the code
serves, requests and limits, and runs as non-root on a read-only root filesystem; every
workload has a PodDisruptionBudget; bookies keep the journal and the ledgers on separate
claims; every argument and MAGNETAR_* variable of a pod (its preStop hook too) is one the
CLI's own parser accepts and maps; the Dockerfile's entrypoint is the CLI; the broker's
grace period covers its preStop drain; the NetworkPolicies say who talks to whom; bookies
open the add socket on 3182 (container port, Service, NetworkPolicies for writers only),
register it at their advertised host, and brokers and auto-recovery add through it (TLS
and tokens as gRPC's in prod), while the README's patch turns it off and nothing else.
How: the rendered YAML (tests/k8s_render.py), the CLI's parser (magnetar.cli), the apps'
own routers for the served paths.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tomllib
import os
import re
import subprocess
from unittest import mock

import pytest
import yaml
from prometheus_client import CollectorRegistry

from common.version import __version__
from magnetar import cli, env_flags
from tests import k8s_render as k8s

EXPECTED_REPLICAS = {
    "dev": {"etcd": 1, "bookie": 3, "broker": 2, "gateway": 1, "proxy": 2, "autorecovery": 1, "objectstore": 1},
    # Two auto-recovery processes: one is the elected auditor, both replicate. Two
    # proxies at least: one may die (or be rolled) while clients reconnect to the other.
    "prod": {"etcd": 3, "bookie": 4, "broker": 3, "gateway": 2, "proxy": 2, "autorecovery": 2},
}
# Secrets the operator creates before applying an overlay (k8s/README.md says how).
OPERATOR_SECRETS = {"prod": {"magnetar-gateway", "magnetar-auth", "magnetar-tls", "magnetar-archive-credentials"},
                    "dev": set()}
# Overlays that include k8s/components/security.
SECURED = ("prod",)


@pytest.fixture(scope="module", params=k8s.OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, k8s.render(request.param)


def _served_paths() -> dict[str, set[str]]:
    """The GET paths each role's HTTP server routes, from the apps' own factories."""
    from broker.admin.app import build_admin_app
    from runtime.ops_http import add_ready_route, build_ops_app
    from gateway.app import default_config, init_app
    from magnetar.autorecovery import build_app as build_autorecovery_app
    from proxy.http_forward import add_forward_routes
    from proxy.metrics import ProxyMetrics

    def paths(app) -> set[str]:
        return {r.resource.canonical for r in app.router.routes() if r.method == "GET"}

    bookie_app = build_ops_app(CollectorRegistry(), mock.AsyncMock())
    add_ready_route(bookie_app, mock.AsyncMock())     # what bookie/main.py builds
    proxy_app = build_ops_app(CollectorRegistry(), mock.AsyncMock())
    add_forward_routes(proxy_app, mock.MagicMock(), ProxyMetrics(CollectorRegistry()))    # what proxy/main.py builds
    return {"broker": paths(build_admin_app(mock.MagicMock(), CollectorRegistry())),
            "gateway": paths(init_app(default_config())),
            "bookie": paths(bookie_app),
            "proxy": paths(proxy_app),
            "autorecovery": paths(build_autorecovery_app(CollectorRegistry(), mock.AsyncMock(), mock.AsyncMock())),
            # etcd's own (3.5): /health, and /health?serializable=true (no quorum needed).
            "etcd": {"/health", "/metrics"},
            # dev's SeaweedFS (4.48): its S3 gateway's and master's health, its metrics
            # port (tests/integration/test_k8s_dev.py probes them on the real binary).
            "objectstore": {"/healthz", "/cluster/healthz", "/metrics"}}


def _probes(container: dict) -> dict[str, dict]:
    return {kind: container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe") if kind in container}


def _port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    matches = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    assert len(matches) == 1, (container["name"], port)
    return matches[0]


def test_renders_and_validates_strictly(tmp_path):
    paths = []
    for overlay in k8s.OVERLAYS:
        objects = k8s.render(overlay)
        assert {o["kind"] for o in objects} >= {"StatefulSet", "Deployment", "Service", "PodDisruptionBudget",
                                                 "HorizontalPodAutoscaler", "NetworkPolicy", "ConfigMap"}
        path = tmp_path / f"{overlay}.yaml"
        path.write_text(k8s.render_text(overlay))
        paths.append(str(path))
    for version in k8s.KUBERNETES_VERSIONS:      # one run checks every overlay's file
        result = subprocess.run([k8s.tool("kubernetes-validate"), "--strict", "-k", version, "--quiet", *paths],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"against {version}:\n{result.stdout}{result.stderr}"


def test_validation_can_fail(tmp_path):
    """The check above is not vacuous: a misspelt field is refused."""
    text = k8s.render_text("dev").replace("maxUnavailable: 1", "maxUnavailable: 1\n  maxUnavialable: 1", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = subprocess.run([k8s.tool("kubernetes-validate"), "--strict", "-k", k8s.KUBERNETES_VERSIONS[-1],
                             "--quiet", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "maxUnavialable" in result.stdout + result.stderr


def test_overlay_sizes(rendered):
    overlay, objects = rendered
    replicas = {k8s.component(w): w["spec"]["replicas"] for w in k8s.workloads(objects)}
    assert replicas == EXPECTED_REPLICAS[overlay]
    assert {o["metadata"].get("namespace") for o in objects} == {k8s.NAMESPACE}
    for hpa in k8s.by_kind(objects, "HorizontalPodAutoscaler"):
        target = k8s.named(objects, hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
        assert target["kind"] == "Deployment"
        assert hpa["spec"]["minReplicas"] <= target["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
        # Scale-down moves bundles: never faster than one pod at a time, after a window.
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
        assert all(p["type"] == "Pods" and p["value"] == 1 for p in hpa["spec"]["behavior"]["scaleDown"]["policies"])
    assert {k8s.component(k8s.named(objects, "Deployment", h["spec"]["scaleTargetRef"]["name"]))
            for h in k8s.by_kind(objects, "HorizontalPodAutoscaler")} == {"broker", "gateway", "proxy"}


def test_probes_on_paths_the_code_serves(rendered):
    _, objects = rendered
    served = _served_paths()
    for workload in k8s.workloads(objects):
        container = k8s.pods(workload)[0].container
        probes = _probes(container)
        assert {"livenessProbe", "readinessProbe"} <= set(probes), container["name"]
        for kind, probe in probes.items():
            assert "httpGet" in probe, (container["name"], kind)
            path = probe["httpGet"]["path"].split("?")[0]
            assert path in served[k8s.component(workload)], (container["name"], kind, path)
            _port_number(container, probe["httpGet"]["port"])
        # Liveness is not readiness: a bookie cut off from etcd or a broker handing over
        # must not be restarted for it.
        assert probes["livenessProbe"]["httpGet"]["path"] != probes["readinessProbe"]["httpGet"]["path"]
    assert k8s.named(objects, "Deployment", "magnetar-broker")["spec"]["template"]["spec"]["containers"][0][
        "readinessProbe"]["httpGet"]["path"] == "/ready"
    assert k8s.named(objects, "StatefulSet", "magnetar-bookie")["spec"]["template"]["spec"]["containers"][0][
        "readinessProbe"]["httpGet"]["path"] == "/ready"
    assert k8s.named(objects, "Deployment", "magnetar-autorecovery")["spec"]["template"]["spec"]["containers"][0][
        "readinessProbe"]["httpGet"]["path"] == "/ready"


def test_resources_and_security(rendered):
    _, objects = rendered
    for workload in k8s.workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        assert spec["enableServiceLinks"] is False       # no <SERVICE>_PORT variables (magnetar/env_flags.py)
        assert spec["automountServiceAccountToken"] is False
        pod_security = spec["securityContext"]
        assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0
        assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
        for container in spec["containers"]:
            resources = container["resources"]
            for key in ("cpu", "memory"):
                assert key in resources["requests"] and key in resources["limits"], (container["name"], key)
            assert resources["requests"]["memory"] == resources["limits"]["memory"], container["name"]
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["readOnlyRootFilesystem"] is True
            assert security["capabilities"]["drop"] == ["ALL"]
            if k8s.component(workload) == "objectstore":    # dev's SeaweedFS: its own image, pinned
                assert re.fullmatch(r"chrislusf/seaweedfs:\d+\.\d+", container["image"]), container["image"]
            else:
                assert container["image"] == f"magnetar:{__version__}"     # pinned, never :latest
            # Writable places are volumes: /tmp an emptyDir with a size limit.
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            tmp = [v for v in spec["volumes"] if v["name"] == mounts["/tmp"]][0]
            assert tmp["emptyDir"]["sizeLimit"]


def test_prometheus_annotations(rendered):
    _, objects = rendered
    for workload in k8s.workloads(objects):
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        container = k8s.pods(workload)[0].container
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) in {p["containerPort"] for p in container["ports"]}


def test_every_workload_has_a_disruption_budget(rendered):
    _, objects = rendered
    budgets = k8s.by_kind(objects, "PodDisruptionBudget")
    for workload in k8s.workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, workload["metadata"]["name"]
        assert covering[0]["spec"]["maxUnavailable"] == 1


def test_the_proxies_are_the_front_door(rendered):
    """The proxies: one Service of type LoadBalancer for clients outside, its ports the
    binary protocol and HTTP (6650/8080; secured 6651/8443 only), each leading to a port
    the proxy container declares; at least two pods, spread over nodes, rolled one new
    pod before an old one goes, autoscaled from two."""
    overlay, objects = rendered
    proxies = k8s.named(objects, "Deployment", "magnetar-proxy")
    pod = k8s.pods(proxies)[0]
    container_ports = {p["name"]: p["containerPort"] for p in pod.container["ports"]}
    service = k8s.named(objects, "Service", "magnetar-proxy")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["selector"].items() <= proxies["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["port"]: container_ports[p["targetPort"]] for p in service["spec"]["ports"]}
    assert ports == ({6651: 6651, 8443: 8443} if overlay in SECURED else {6650: 6650, 8080: 8080})
    # No other Service reaches the proxy pods (the front door is the load balancer).
    assert [s["metadata"]["name"] for s in k8s.by_kind(objects, "Service")
            if s["spec"].get("selector", {}).get("app.kubernetes.io/component") == "proxy"] == ["magnetar-proxy"]
    spread = pod.spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread[0]["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= \
        proxies["spec"]["template"]["metadata"]["labels"].items()
    assert proxies["spec"]["replicas"] >= 2
    assert proxies["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    hpa = next(h for h in k8s.by_kind(objects, "HorizontalPodAutoscaler")
               if h["spec"]["scaleTargetRef"]["name"] == "magnetar-proxy")
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    # Probes on the proxy's own paths (served without a broker call): ready once a broker
    # is registered, alive while its loop answers.
    assert pod.container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert pod.container["livenessProbe"]["httpGet"]["path"] == "/live"


def test_bookies_keep_journal_and_ledgers_on_separate_claims(rendered):
    overlay, objects = rendered
    bookies = k8s.named(objects, "StatefulSet", "magnetar-bookie")
    pod = k8s.pods(bookies)[0]
    claims = {t["metadata"]["name"]: t for t in bookies["spec"]["volumeClaimTemplates"]}
    assert set(claims) == {"journal", "ledgers"}
    mounts = {m["name"]: m["mountPath"] for m in pod.container["volumeMounts"]}
    env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
    assert env["MAGNETAR_JOURNAL_DIR"].startswith(mounts["journal"] + "/")
    for ledger_dir in env["MAGNETAR_LEDGER_DIR"].split(","):
        assert ledger_dir.startswith(mounts["ledgers"] + "/")
    assert not mounts["journal"].startswith(mounts["ledgers"]) and not mounts["ledgers"].startswith(mounts["journal"])
    # Identity: the pod's DNS name through the headless Service, also the dialled address.
    assert env["MAGNETAR_BOOKIE_ID"] == f"{pod.name}.{bookies['spec']['serviceName']}:3181"
    if overlay in SECURED:
        # Dialled under <namespace>.svc: a name the certificate's wildcard SAN covers
        # (gRPC checks the host name; *.magnetar-bookie would match no two-label name).
        assert env["MAGNETAR_ADVERTISED_ADDRESS"] == f"{pod.name}.{bookies['spec']['serviceName']}.{k8s.NAMESPACE}.svc:3181"
    else:
        assert env["MAGNETAR_ADVERTISED_ADDRESS"] == env["MAGNETAR_BOOKIE_ID"]
    service = k8s.named(objects, "Service", bookies["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert bookies["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain",
                                                                        "whenScaled": "Retain"}
    anti = bookies["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    hard = "requiredDuringSchedulingIgnoredDuringExecution" in anti
    assert hard == (overlay == "prod")
    if overlay == "prod":
        assert claims["journal"]["spec"]["storageClassName"] != claims["ledgers"]["spec"]["storageClassName"]
    etcd = k8s.named(objects, "StatefulSet", "magnetar-etcd")
    assert [t["metadata"]["name"] for t in etcd["spec"]["volumeClaimTemplates"]] == ["data"]


def _command_lines(objects: list[dict]):
    """(workload, pod, kind, argv, env) of every command a pod runs: its container's
    command and its preStop hook (kind "command" / "preStop")."""
    for workload in k8s.workloads(objects):
        pod = k8s.pods(workload)[0]
        env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
        for kind, argv in (("command", k8s.command_line(pod.container, env)),
                           ("preStop", k8s.pre_stop_command(pod.container, env))):
            if argv is not None:
                yield workload, pod, kind, argv, env


def _magnetar_command_lines(objects: list[dict]):
    """(where, argv after 'magnetar', env) of every magnetar command a pod runs, preStop hooks too."""
    for workload, pod, kind, argv, env in _command_lines(objects):
        if argv[0] == "etcd":
            assert k8s.component(workload) == "etcd" and kind == "command"
            continue
        if argv[0] == "weed":
            assert k8s.component(workload) == "objectstore" and kind == "command"
            continue
        assert argv[0] == "magnetar", argv
        yield f"{pod.name} {kind}", argv[1:], env


def test_every_flag_and_variable_is_the_clis(rendered):
    _, objects = rendered
    seen_commands = set()
    for where, argv, env in _magnetar_command_lines(objects):
        args = cli.parse_command_line(argv, env)     # SystemExit on any flag or value it refuses
        seen_commands.add(args.process)
        parser = cli.build_parser(argv)
        mapped = set(env_flags.mapped_flags(parser))
        mapped |= set(env_flags.mapped_flags(cli.command_parser(parser, args.process)))
        variables = {name for name in env if name.startswith(env_flags.PREFIX)}
        if where.endswith("preStop"):
            # The hook runs in the container's environment: only the global options
            # may reach it from there, not the server's own settings.
            assert variables & mapped <= {"MAGNETAR_LOG_LEVEL", "MAGNETAR_LOG_FORMAT"}, where
            continue
        # Every MAGNETAR_* variable sets a flag of the command (a misspelt one would be
        # silently ignored otherwise).
        assert variables <= mapped, f"{where}: {sorted(variables - mapped)} are no flags of magnetar {args.process}"
    assert seen_commands == {"bookie", "broker", "gateway", "proxy", "autorecovery", "admin"}


def test_variables_reach_the_config(rendered):
    """The parsed namespaces carry the pods' values into the servers' config objects."""
    from bookie.main import config_from_args as bookie_config
    from broker.main import config_from_args as broker_config

    overlay, objects = rendered
    for where, argv, env in _magnetar_command_lines(objects):
        args = cli.parse_command_line(argv, env)
        if args.process == "bookie":
            config = bookie_config(args)
            assert (config.host, config.port, config.http_port) == ("0.0.0.0", 3181, 8000)
            assert config.bookie_id == env["MAGNETAR_BOOKIE_ID"]
            assert config.advertised_address == env["MAGNETAR_ADVERTISED_ADDRESS"]
            assert config.journal.journal_dir == env["MAGNETAR_JOURNAL_DIR"]
        elif args.process == "broker":
            config = broker_config(args)
            assert config.broker_id == where.split()[0]
            if overlay in SECURED:      # lookups answer the TLS URLs only
                assert config.service_url == "pulsar+ssl://10.0.0.1:6651"
                assert config.web_service_url == "https://10.0.0.1:8443"
            else:
                assert config.service_url == "pulsar://10.0.0.1:6650"
                assert config.web_service_url == "http://10.0.0.1:8080"
            assert config.metadata_url == env["MAGNETAR_METADATA"]
            # The archive: an object store location, dev's own store or AWS (endpoint "").
            from broker.main import archiver_config_from_args

            archiver = archiver_config_from_args(args)
            assert archiver.location_url == "s3://magnetar-archive/archive"
            assert archiver.endpoint_url == ("http://magnetar-objectstore:8333" if overlay == "dev" else "")
            # Its credentials: a file from the Secret (never a variable or a flag).
            pod_spec = k8s.named(objects, "Deployment", "magnetar-broker")["spec"]["template"]["spec"]
            credentials = [v for v in pod_spec["volumes"] if v["name"] == "archive-credentials"][0]["secret"]
            assert credentials["secretName"].startswith("magnetar-archive-credentials")   # dev: a hash suffix
            mount = [m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "archive-credentials"][0]
            assert env["AWS_SHARED_CREDENTIALS_FILE"] == f"{mount['mountPath']}/credentials"
            assert not any(name.startswith("AWS_") and name != "AWS_SHARED_CREDENTIALS_FILE" for name in env)
        elif args.process == "proxy":
            from proxy.main import config_from_args as proxy_config

            config = proxy_config(args)
            assert config.host == "0.0.0.0" and config.metadata_url == env["MAGNETAR_METADATA"], where
            if overlay in SECURED:
                assert (config.plain_ports_enabled, config.tls_port, config.http_tls_port) == (False, 6651, 8443)
            else:
                assert (config.plain_ports_enabled, config.port, config.http_port) == (True, 6650, 8080)
        elif args.process == "autorecovery":
            # Reachable by the kubelet's probes and scrapers; named after its pod.
            assert (args.host, args.http_port) == ("0.0.0.0", 8010)
            assert args.metadata == env["MAGNETAR_METADATA"] and args.id == where.split()[0]


ADD_SOCKET_PORT = 3182


def test_bookies_take_adds_on_the_add_socket(rendered):
    """Bookies listen on the add socket (3182, a named container port and a port of the
    headless Service) and register it at the host writers dial for gRPC (the pod's DNS
    name, not the bound 0.0.0.0); brokers, auto-recovery and `magnetar shell` in a
    broker pod add through it; with the security component it takes the gRPC port's TLS
    (client certificates required) and tokens."""
    from bookie.main import add_address_for, config_from_args as bookie_config
    from broker.main import ledger_config_from_args
    from magnetar.autorecovery import ledger_config_from_args as recovery_ledger_config

    overlay, objects = rendered
    bookies = k8s.named(objects, "StatefulSet", "magnetar-bookie")
    container = k8s.pods(bookies)[0].container
    assert _port_number(container, "add-socket") == ADD_SOCKET_PORT
    assert ADD_SOCKET_PORT not in {p["containerPort"] for p in container["ports"] if p["name"] != "add-socket"}
    service = k8s.named(objects, "Service", bookies["spec"]["serviceName"])
    ports = {p["port"]: p for p in service["spec"]["ports"]}
    assert _port_number(container, ports[ADD_SOCKET_PORT]["targetPort"]) == ADD_SOCKET_PORT
    writers = set()
    for where, argv, env in _magnetar_command_lines(objects):
        if where.endswith("preStop"):
            continue
        args = cli.parse_command_line(argv, env)
        if args.process == "bookie":
            config = bookie_config(args)
            assert config.add_socket_port == ADD_SOCKET_PORT, where
            host = config.advertised_address.rsplit(":", 1)[0]
            assert host.startswith(where.split()[0] + "." + bookies["spec"]["serviceName"]), (where, host)
            assert add_address_for(config.advertised_address, config.add_socket_port) == f"{host}:{ADD_SOCKET_PORT}"
            if overlay in SECURED:
                assert config.security.tls.enabled and config.security.tls.require_client_cert, where
                assert config.security.authentication_enabled, where
        elif args.process in ("broker", "autorecovery"):
            ledger = (ledger_config_from_args if args.process == "broker" else recovery_ledger_config)(args)
            assert ledger.add_transport == "socket", where
            writers.add(args.process)
            if args.process == "broker":     # the README's tools run in a broker pod
                shell = cli.parse_command_line(["shell", "listbookies"], env)
                assert shell.bookie_add_transport == "socket", where
    assert writers == {"broker", "autorecovery"}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_readme_patch_turns_the_add_socket_off(overlay, tmp_path):
    """k8s/README.md's patch, in an overlay of one's own over dev or prod, renders bookies
    without the add socket (they register no add address: writers add over gRPC) and
    changes nothing else of them."""
    from bookie.main import config_from_args as bookie_config

    section = (k8s.K8S / "README.md").read_text().split("\n## The add socket", 1)[1].split("\n## ", 1)[0]
    patch = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "no-add-socket.yaml").write_text(patch)
    base = os.path.relpath(k8s.K8S / "overlays" / overlay, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\npatches:\n  - path: no-add-socket.yaml\n")
    result = subprocess.run([k8s.tool("kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    patched = [o for o in yaml.safe_load_all(result.stdout) if o]

    def bookie(objects: list[dict]):
        pod = k8s.pods(k8s.named(objects, "StatefulSet", "magnetar-bookie"))[0]
        env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
        return bookie_config(cli.parse_command_line(k8s.command_line(pod.container, env)[1:], env))

    before, after = bookie(k8s.render(overlay)), bookie(patched)
    assert (before.add_socket_port, after.add_socket_port) == (ADD_SOCKET_PORT, -1)
    assert dataclasses.replace(after, add_socket_port=ADD_SOCKET_PORT) == before


def test_grace_periods_cover_the_pre_stop_drain(rendered):
    overlay, objects = rendered
    broker = k8s.named(objects, "Deployment", "magnetar-broker")
    pod = k8s.pods(broker)[0]
    env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
    argv = k8s.pre_stop_command(pod.container, env)
    args = cli.parse_command_line(argv[1:], env)
    assert (args.process, args.resource, args.action) == ("admin", "brokers", "drain")
    if overlay in SECURED:
        # HTTPS, the certificate checked against the CA (it names localhost).
        assert args.admin_url == f"https://localhost:{_port_number(pod.container, 'https')}"
        assert args.tls_trust_certs_file
    else:
        assert args.admin_url == f"http://127.0.0.1:{_port_number(pod.container, 'http')}"
    assert pod.spec["terminationGracePeriodSeconds"] >= args.request_timeout_s + 20


def test_config_references_resolve(rendered):
    overlay, objects = rendered
    present = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for workload in k8s.workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        for container in spec["containers"]:
            for item in container.get("env", []):
                source = item.get("valueFrom", {})
                if "configMapKeyRef" in source:
                    assert ("ConfigMap", source["configMapKeyRef"]["name"]) in present
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert ("Secret", name) in present or name in OPERATOR_SECRETS[overlay], name


def test_etcd_members_and_metadata_agree(rendered):
    overlay, objects = rendered
    etcd = k8s.named(objects, "StatefulSet", "magnetar-etcd")
    members = [p.name for p in k8s.pods(etcd)]
    config = k8s.by_kind(objects, "ConfigMap")[0]["data"]
    initial = dict(item.split("=", 1) for item in config["etcd-initial-cluster"].split(","))
    assert sorted(initial) == members
    endpoints = config["metadata"].removeprefix("etcd://").split("/", 1)[0].split(",")
    assert sorted(e.split(".")[0] for e in endpoints) == members
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"


def test_network_policies_say_who_talks_to_whom(rendered):
    overlay, objects = rendered
    policies = {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
                for p in k8s.by_kind(objects, "NetworkPolicy")}
    assert set(policies) == {"etcd", "bookie", "broker", "gateway", "proxy", "autorecovery"} | (
        {"objectstore"} if overlay == "dev" else set())

    def ingress_from(target: str, port: int) -> set[str] | None:
        """Components allowed to reach ``target`` on ``port``; None: anyone."""
        allowed: set[str] = set()
        for rule in policies[target]["spec"]["ingress"]:
            if port not in [p["port"] for p in rule.get("ports", [])]:
                continue
            if "from" not in rule:
                return None
            allowed |= {peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]}
        return allowed

    # Proxies read the brokers' registrations (and nothing else) in etcd.
    assert ingress_from("etcd", 2379) == {"broker", "bookie", "etcd", "autorecovery", "proxy"}
    assert ingress_from("etcd", 2380) == {"etcd"}
    assert ingress_from("bookie", 3181) == {"broker", "autorecovery"}
    assert ingress_from("bookie", 3182) == {"broker", "autorecovery"}     # the add socket: writers only
    if overlay in SECURED:
        assert ingress_from("broker", 6651) is None and ingress_from("broker", 8443) is None
        assert ingress_from("broker", 6650) == set() and ingress_from("broker", 8080) == set()
        assert ingress_from("etcd", 2381) is None      # /health and /metrics only
        assert ingress_from("proxy", 6651) is None and ingress_from("proxy", 8443) is None
        assert ingress_from("proxy", 6650) == set() and ingress_from("proxy", 8080) == set()
    else:
        assert ingress_from("broker", 6650) is None       # clients, gateways
        assert ingress_from("proxy", 6650) is None and ingress_from("proxy", 8080) is None     # clients outside
    assert ingress_from("gateway", 8081) is None      # clients
    assert ingress_from("autorecovery", 8010) is None     # scrapers

    def egress_to(source: str) -> set[tuple[str, int]]:
        return {(peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"], port["port"])
                for rule in policies[source]["spec"]["egress"] for peer in rule.get("to", [])
                for port in rule["ports"]}

    assert egress_to("autorecovery") == {("etcd", 2379), ("bookie", 3181), ("bookie", 3182)}
    # Proxies reach brokers (lookups, piped connections, the forwarded admin REST) and
    # etcd, never a bookie.
    broker_ports = (6651, 8443) if overlay in SECURED else (6650, 8080)
    assert egress_to("proxy") == {("broker", broker_ports[0]), ("broker", broker_ports[1]), ("etcd", 2379)}
    assert {("bookie", 3181), ("bookie", 3182)} <= egress_to("broker")
    # The archive's object store: dev's own pod, or HTTPS anywhere (AWS S3).
    assert (("objectstore", 8333) in egress_to("broker")) == (overlay == "dev")
    assert any("to" not in rule and [p["port"] for p in rule["ports"]] == [443]
               for rule in policies["broker"]["spec"]["egress"])
    assert not {peer for peer, port in egress_to("gateway") if peer == "bookie"}
    for policy in policies.values():
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_procedure_commands_are_the_clis():
    """Every `magnetar` command a README procedure runs in a pod parses there, with that
    pod's environment, and every procedure of the README is one the tests know."""
    from tests.k8s_local import procedure

    text = (k8s.K8S / "README.md").read_text()
    titles = re.findall(r"^### (.+?)\s*$", text.split("## Procedures", 1)[1].split("\n## ", 1)[0], re.M)
    assert set(titles) == {"Add brokers", "Remove brokers", "Restart brokers", "Restart proxies", "Add bookies",
                           "Decommission a bookie", "Recover a bookie whose volume was lost"}
    objects = k8s.render("dev")
    checked = 0
    for title in titles:
        for line in procedure(title):
            argv = line.split()
            if argv[3] != "exec" or argv[argv.index("--") + 1] != "magnetar":
                continue
            target = argv[4].split("/")[-1]
            workload = next(w for w in k8s.workloads(objects) if target.startswith(w["metadata"]["name"]))
            pod = k8s.pods(workload)[0]
            env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
            cli.parse_command_line(argv[argv.index("--") + 2:], env)
            checked += 1
    assert checked >= 4


def test_dockerfile_runs_the_cli():
    text = (k8s.ROOT / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))
    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert entrypoint == ["magnetar"]
    with pytest.raises(SystemExit) as raised:          # --help: parsed, exits 0
        cli.parse_command_line(command, {})
    assert raised.value.code == 0
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^USER 10001:10001$", text, re.M)
    # The pods' user is the image's.
    for overlay in k8s.OVERLAYS:
        for workload in k8s.workloads(k8s.render(overlay)):
            assert workload["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    ignored = (k8s.ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
    # Every package the Dockerfile copies exists, and every package is copied.
    copied = set(re.findall(r"^COPY (\w+)/ \1/$", text, re.M))
    packages = {p.name for p in k8s.ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests"}
    assert copied == packages
    # The client tools work in the image: the official client comes with the `tools` extra.
    assert re.search(r'pip install "\.\[tools,s3\]"', text)     # the archive's S3 plugin too
    extras = tomllib.loads((k8s.ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(requirement.startswith("pulsar-client") for requirement in extras["tools"])


# --- the secured overlays (k8s/components/security) -----------------------------------------

# Ports left plain on purpose: they serve only the probes' and scrapers' paths.
OPS_PORTS = {("bookie", 8000), ("autorecovery", 8010), ("etcd", 2381)}
OPS_PATHS = {"/health", "/live", "/ready", "/metrics"}
# Paths the brokers and gateways ask a token for (broker/admin/permissions.py's
# middleware; gateway/auth.py's): the probes must stay outside them.
AUTHENTICATED_PREFIXES = {"broker": ("/admin/", "/lookup/"), "gateway": ("/v1/",),
                          "proxy": ("/admin/", "/lookup/")}     # forwarded to brokers, which ask


def _pods_with_args(objects: list[dict]):
    """(workload, pod, container, env, args or None for etcd, where) of every container's
    command and preStop hook."""
    for workload, pod, kind, argv, env in _command_lines(objects):
        args = None if argv[0] in ("etcd", "weed") else cli.parse_command_line(argv[1:], env)
        yield workload, pod, pod.container, env, args, f"{pod.name} {kind}"


def _named_paths(env: dict[str, str], args) -> list[str]:
    """Every file or directory a container's settings name: the parsed options' values
    that are absolute paths (file:// URLs too), or etcd's ETCD_*_FILE / _DIR variables."""
    if args is None:
        return [v for k, v in env.items() if k.startswith("ETCD_") and k.endswith(("_FILE", "_DIR"))]
    values = []
    for value in vars(args).values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.startswith(("/", "file:///")):
                values.append(item.removeprefix("file://"))
    return values


def _mount_of(container: dict, path: str) -> dict | None:
    matches = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    return max(matches, key=lambda m: len(m["mountPath"])) if matches else None


def test_env_references_all_resolve(rendered):
    """Every $(VAR) of a pod's environment and command names a variable defined before it
    (Kubernetes leaves an unknown one as written: a broker would advertise '$(POD_IP)')."""
    _, objects = rendered
    for workload, pod, container, env, args, where in _pods_with_args(objects):
        argv = k8s.command_line(container, env) + (k8s.pre_stop_command(container, env) or [])
        for text in [*env.values(), *argv]:
            assert "$(" not in text, (where, text)


def test_every_named_file_is_in_a_mounted_volume(rendered):
    """Every file or directory a flag, MAGNETAR_* or ETCD_* variable names lies in a volume
    mounted in that container; a file in a Secret volume with items is one of its items."""
    overlay, objects = rendered
    checked = 0
    for workload, pod, container, env, args, where in _pods_with_args(objects):
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for path in _named_paths(env, args):
            mount = _mount_of(container, path)
            assert mount is not None, f"{where}: {path} is in no mounted volume"
            assert mount["name"] in volumes or mount["name"] in claims, (where, mount)
            secret = volumes.get(mount["name"], {}).get("secret")
            if secret is not None:
                assert mount.get("readOnly") is True, (where, path)
                relative = path[len(mount["mountPath"].rstrip("/")) + 1:]
                if "items" in secret:
                    assert relative in {item["path"] for item in secret["items"]}, (where, path)
            checked += 1
    assert checked >= (40 if overlay in SECURED else 4), checked


def _readme_security_rows() -> list[str]:
    text = (k8s.K8S / "README.md").read_text()
    section = text.split("\n## Security", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|")]


def test_every_operator_secret_and_key_is_documented(rendered):
    """Each Secret a pod mounts that the overlay does not generate, and each of its keys a
    pod uses, has a row in k8s/README.md's Security table (the operator creates it)."""
    overlay, objects = rendered
    generated = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    rows = _readme_security_rows()
    used: dict[str, set[str]] = {}
    for workload, pod, container, env, args, where in _pods_with_args(objects):
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for volume in volumes.values():
            if "secret" in volume and "items" in volume["secret"]:
                used.setdefault(volume["secret"]["secretName"], set()).update(
                    item["key"] for item in volume["secret"]["items"])
        for path in _named_paths(env, args):
            mount = _mount_of(container, path)
            secret = volumes.get(mount["name"], {}).get("secret") if mount else None
            if secret is not None and "items" not in secret:
                used.setdefault(secret["secretName"], set()).add(path.rsplit("/", 1)[1])
    operator = {name: keys for name, keys in used.items() if name not in generated}
    assert set(operator) == OPERATOR_SECRETS[overlay]
    for name, keys in operator.items():
        for key in keys:
            assert [r for r in rows if f"`{name}`" in r and f"`{key}`" in r], f"{name}/{key} not in k8s/README.md"


def test_secured_overlay_has_no_plain_client_port():
    """prod: every port a container or Service opens is TLS, except the ops ports, which
    serve the probes' and scrapers' paths only. Brokers listen on 6651 and 8443 alone."""
    _check_no_plain_client_port(k8s.render("prod"))


@pytest.mark.parametrize("mutation", ["plain ports on", "bookie without client certificates", "plain etcd"])
def test_plain_client_port_check_can_fail(mutation):
    """The check above refuses prod with one hop left in clear text."""
    objects = copy.deepcopy(k8s.render("prod"))
    name, variable, value = {"plain ports on": ("magnetar-broker", "MAGNETAR_NO_PLAIN_PORTS", "false"),
                             "bookie without client certificates": ("magnetar-bookie", "MAGNETAR_TLS_REQUIRE_CLIENT_CERT",
                                                                    "false"),
                             "plain etcd": ("magnetar-etcd", "ETCD_LISTEN_CLIENT_URLS", "http://0.0.0.0:2379")}[mutation]
    workload = next(w for w in k8s.workloads(objects) if w["metadata"]["name"] == name)
    container = workload["spec"]["template"]["spec"]["containers"][0]
    next(item for item in container["env"] if item["name"] == variable)["value"] = value
    if mutation == "plain ports on":
        container["ports"].append({"name": "pulsar", "containerPort": 6650})
    with pytest.raises(AssertionError):
        _check_no_plain_client_port(objects)


def _check_no_plain_client_port(objects: list[dict]) -> None:
    from bookie.main import config_from_args as bookie_config
    from broker.main import config_from_args as broker_config

    served = _served_paths()
    tls_ports: dict[str, set[int]] = {}
    for workload, pod, container, env, args, where in _pods_with_args(objects):
        if where.endswith("preStop"):
            continue
        component = k8s.component(workload)
        if component == "etcd":
            assert env["ETCD_LISTEN_CLIENT_URLS"].startswith("https://")
            assert env["ETCD_LISTEN_PEER_URLS"].startswith("https://")
            assert env["ETCD_LISTEN_METRICS_URLS"] == "http://0.0.0.0:2381"
            secure = {2379, 2380}
        elif component == "broker":
            config = broker_config(args)
            assert config.tls.enabled and not config.plain_ports_enabled, where
            secure = {config.tls_port, config.http_tls_port}
            assert secure == {6651, 8443}
        elif component == "gateway":
            assert args.tls_cert_file, where        # HTTPS only on its one port
            secure = {args.port}
        elif component == "proxy":
            from proxy.main import config_from_args as proxy_config

            config = proxy_config(args)
            assert config.tls.enabled and not config.plain_ports_enabled, where
            secure = {config.tls_port, config.http_tls_port}
            assert secure == {6651, 8443}
        elif component == "bookie":
            config = bookie_config(args)
            assert config.security.tls.enabled and config.security.tls.require_client_cert, where
            # The add socket serves TLS with the gRPC port's settings (bookie/main.py).
            secure = {config.port, config.add_socket_port}
        else:
            secure = set()
        opened = {p["containerPort"] for p in container["ports"]}
        for port in opened - secure:
            assert (component, port) in OPS_PORTS, f"{where}: plain port {port}"
            if component != "etcd":    # etcd's metrics listener: /health and /metrics (etcd's docs)
                assert served[component] <= OPS_PATHS, (component, served[component])
        tls_ports[component] = opened & secure
        for probe in _probes(container).values():
            port = _port_number(container, probe["httpGet"]["port"])
            scheme = probe["httpGet"].get("scheme", "HTTP")
            assert (scheme == "HTTPS") == (port in secure), (where, port, scheme)
            assert not probe["httpGet"]["path"].startswith(AUTHENTICATED_PREFIXES.get(component, ("//",))), where
    assert tls_ports["broker"] == {6651, 8443} and tls_ports["proxy"] == {6651, 8443}
    for service in k8s.by_kind(objects, "Service"):
        component = service["spec"]["selector"]["app.kubernetes.io/component"]
        workload = next(w for w in k8s.workloads(objects) if k8s.component(w) == component)
        container = k8s.pods(workload)[0].container
        for port in service["spec"]["ports"]:
            number = _port_number(container, port["targetPort"])
            assert number in tls_ports[component] or (component, number) in OPS_PORTS, (service["metadata"]["name"], port)


def test_secured_overlay_every_hop_is_tls_with_service_identities():
    """prod: brokers and auto-recovery reach bookies with mutual TLS and a service token of
    an allowed role; brokers, bookies and auto-recovery reach etcd with a client
    certificate; etcd requires one from clients and peers; gateways reach brokers over
    pulsar+ssl:// and HTTPS (the CA checked) with their token; brokers authenticate and
    authorize every client, the service roles superusers as documented; the preStop drain
    and `magnetar shell` in a broker pod use the same credentials; and no Secret is
    rendered (no key material in the repository)."""
    from bookie.main import config_from_args as bookie_config
    from broker.main import config_from_args as broker_config, ledger_config_from_args
    from magnetar.autorecovery import ledger_config_from_args as recovery_ledger_config
    from metadata.etcd_tls import etcd_tls_from_args

    objects = k8s.render("prod")
    assert not [o for o in objects if o["kind"] == "Secret"]
    seen = set()

    def mutual_to_bookies(ledger, token_name: str) -> None:
        assert ledger.bookie_tls_enabled and ledger.bookie_tls.trust_certs_file and ledger.bookie_tls.cert_file
        assert ledger.bookie_auth_token_file.endswith("/" + token_name)

    def client_cert_to_etcd(args) -> None:
        tls = etcd_tls_from_args(args)
        assert tls.enabled and tls.trust_certs_file and tls.cert_file and tls.key_file

    for workload, pod, container, env, args, where in _pods_with_args(objects):
        if args is None:
            assert env["ETCD_CLIENT_CERT_AUTH"] == "true" and env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
            assert env["ETCD_TRUSTED_CA_FILE"] and env["ETCD_PEER_TRUSTED_CA_FILE"]
            assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"https://{pod.name}.magnetar-etcd.{k8s.NAMESPACE}.svc:2379"
            for member in env["ETCD_INITIAL_CLUSTER"].split(","):
                assert member.split("=", 1)[1].startswith("https://"), member
            seen.add("etcd")
            continue
        if args.process == "broker":
            config, ledger = broker_config(args), ledger_config_from_args(args)
            assert config.auth.authentication_enabled and config.auth.authorization_enabled, where
            assert set(config.auth.superuser_roles.split(",")) == {"admin", "magnetar-gateway", "magnetar-broker"}
            # The proxies' role may name a client (original_principal); it is no superuser.
            assert config.auth.proxies == {"magnetar-proxy"} and not config.auth.proxies & config.auth.superusers
            # What a broker presents to the others (an admin request's calls on their
            # partitions): the token of its own role, mounted with the bookies' one.
            assert config.auth.broker_client_token_file == ledger.bookie_auth_token_file, where
            assert config.auth.token_secret_key.startswith("file:///")
            mutual_to_bookies(ledger, "broker.token")
            client_cert_to_etcd(args)
            # `magnetar shell` run in a broker pod (k8s/README.md) takes the same settings.
            shell = cli.parse_command_line(["shell", "listbookies"], env)
            assert (shell.bookie_tls, shell.bookie_tls_cert_file, shell.bookie_auth_token_file) == (
                True, ledger.bookie_tls.cert_file, ledger.bookie_auth_token_file)
            client_cert_to_etcd(shell)
        elif args.process == "bookie":
            security = bookie_config(args).security
            assert security.authentication_enabled and security.token_secret_key.startswith("file:///"), where
            assert set(security.allowed_roles.split(",")) == {"magnetar-broker", "magnetar-autorecovery"}
            assert security.tls.require_client_cert and security.tls.trust_certs_file
            client_cert_to_etcd(args)
        elif args.process == "autorecovery":
            mutual_to_bookies(recovery_ledger_config(args), "autorecovery.token")
            client_cert_to_etcd(args)
        elif args.process == "gateway":
            # (gateway_config would read the files; the parsed flags are what it takes.)
            assert args.authentication_enabled and args.service_token_file.endswith("/gateway.token"), where
            assert args.service_url == "pulsar+ssl://magnetar-broker:6651"
            assert args.admin_url == "https://magnetar-broker:8443"
            assert args.broker_tls_trust_certs_file and args.broker_tls_hostname_verification is False
            assert args.tls_cert_file and args.advertised_url == "https://10.0.0.1:8081"
        elif args.process == "proxy":
            from proxy.main import auth_config_from_args, config_from_args as proxy_config

            config, auth = proxy_config(args), auth_config_from_args(args)
            assert auth.authentication_enabled and auth.providers == ("token",), where
            assert auth.token_secret_key.startswith("file:///") and auth.broker_token_file.endswith("/proxy.token")
            assert config.broker_tls_only and config.broker_tls_trust_certs_file, where
            assert config.broker_tls_hostname_verification is False       # lookups name pod IPs
            client_cert_to_etcd(args)
        elif args.process == "admin":
            assert args.admin_url.startswith("https://") and args.tls_trust_certs_file, where
            assert args.token_file.endswith("/superuser.token"), where
        seen.add(args.process)
    assert seen == {"etcd", "bookie", "broker", "gateway", "proxy", "autorecovery", "admin"}
    # The etcd endpoints every process dials are names the certificate's wildcard covers.
    config = k8s.by_kind(objects, "ConfigMap")[0]["data"]
    for endpoint in config["metadata"].removeprefix("etcd://").split("/", 1)[0].split(","):
        assert endpoint.split(":")[0].endswith(f".magnetar-etcd.{k8s.NAMESPACE}.svc"), endpoint


def test_dev_stays_plain():
    for workload, pod, container, env, args, where in _pods_with_args(k8s.render("dev")):
        if args is not None and args.process in ("broker", "gateway", "bookie", "proxy"):
            assert not args.tls_cert_file, where


def test_every_etcd_variable_is_an_etcd_flag(rendered):
    """etcd takes ETCD_<FLAG> for --<flag> and only warns about one it does not know: each
    ETCD_* variable of the etcd pods is a flag of the etcd the image carries (its --help)."""
    _, objects = rendered
    result = subprocess.run([k8s.tool("etcd"), "--help"], capture_output=True, text=True, timeout=60)
    flags = set(re.findall(r"--([a-z0-9-]+)", result.stdout + result.stderr))
    assert {"listen-client-urls", "client-cert-auth"} <= flags
    etcd = k8s.named(objects, "StatefulSet", "magnetar-etcd")
    pod = k8s.pods(etcd)[0]
    names = [item["name"] for item in pod.container["env"] if item["name"].startswith("ETCD_")]
    assert names
    for name in names:
        assert name.removeprefix("ETCD_").lower().replace("_", "-") in flags, name
