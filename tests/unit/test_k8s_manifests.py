"""The Kubernetes manifests (k8s/) cannot drift from the code.

What it proves, on the objects ``kubectl kustomize`` renders for every overlay: each passes
``kubernetes-validate --strict`` for three Kubernetes minor versions; the overlays have the
sizes they promise; every container has liveness and readiness probes on paths the code
serves, requests and limits, and runs as non-root on a read-only root filesystem; every
workload has a PodDisruptionBudget; bookies keep the journal and the ledgers on separate
claims; every argument and MAGNETAR_* variable of a pod (its preStop hook too) is one the
CLI's own parser accepts and maps; the Dockerfile's entrypoint is the CLI; the broker's
grace period covers its preStop drain; the NetworkPolicies say who talks to whom.
How: the rendered YAML (tests/k8s_render.py), the CLI's parser (magnetar.cli), the apps'
own routers for the served paths.
"""

from __future__ import annotations

import json
import re
import subprocess
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry

from common.version import __version__
from magnetar import cli, env_flags
from tests import k8s_render as k8s

EXPECTED_REPLICAS = {
    "dev": {"etcd": 1, "bookie": 3, "broker": 2, "gateway": 1, "autorecovery": 1},
    # Two auto-recovery processes: one is the elected auditor, both replicate.
    "prod": {"etcd": 3, "bookie": 4, "broker": 3, "gateway": 2, "autorecovery": 2},
}
# Secrets the operator creates before applying an overlay (k8s/README.md says how).
OPERATOR_SECRETS = {"prod": {"magnetar-gateway", "magnetar-auth", "magnetar-tls"}, "dev": set()}


@pytest.fixture(scope="module", params=k8s.OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, k8s.render(request.param)


def _served_paths() -> dict[str, set[str]]:
    """The GET paths each role's HTTP server routes, from the apps' own factories."""
    from broker.admin.app import build_admin_app
    from common.ops_http import add_ready_route, build_ops_app
    from gateway.app import default_config, init_app
    from magnetar.autorecovery import build_app as build_autorecovery_app

    def paths(app) -> set[str]:
        return {r.resource.canonical for r in app.router.routes() if r.method == "GET"}

    bookie_app = build_ops_app(CollectorRegistry(), mock.AsyncMock())
    add_ready_route(bookie_app, mock.AsyncMock())     # what bookie/main.py builds
    return {"broker": paths(build_admin_app(mock.MagicMock(), CollectorRegistry())),
            "gateway": paths(init_app(default_config())),
            "bookie": paths(bookie_app),
            "autorecovery": paths(build_autorecovery_app(CollectorRegistry(), mock.AsyncMock(), mock.AsyncMock())),
            # etcd's own (3.5): /health, and /health?serializable=true (no quorum needed).
            "etcd": {"/health", "/metrics"}}


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
            for h in k8s.by_kind(objects, "HorizontalPodAutoscaler")} == {"broker", "gateway"}


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


def _magnetar_command_lines(objects: list[dict]):
    """(where, argv after 'magnetar', env) of every magnetar command a pod runs, preStop hooks too."""
    for workload in k8s.workloads(objects):
        pod = k8s.pods(workload)[0]
        env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
        for kind, argv in (("command", k8s.command_line(pod.container, env)),
                           ("preStop", k8s.pre_stop_command(pod.container, env))):
            if argv is None:
                continue
            if argv[0] == "etcd":
                assert k8s.component(workload) == "etcd" and kind == "command"
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
    assert seen_commands == {"bookie", "broker", "gateway", "autorecovery", "admin"}


def test_variables_reach_the_config(rendered):
    """The parsed namespaces carry the pods' values into the servers' config objects."""
    from bookie.main import config_from_args as bookie_config
    from broker.main import config_from_args as broker_config

    _, objects = rendered
    for where, argv, env in _magnetar_command_lines(objects):
        args = cli.parse_command_line(argv, env)
        if args.process == "bookie":
            config = bookie_config(args)
            assert (config.host, config.port, config.http_port) == ("0.0.0.0", 3181, 8000)
            assert config.bookie_id == config.advertised_address == env["MAGNETAR_BOOKIE_ID"]
            assert config.journal.journal_dir == env["MAGNETAR_JOURNAL_DIR"]
        elif args.process == "broker":
            config = broker_config(args)
            assert config.broker_id == where.split()[0]
            assert config.service_url == "pulsar://10.0.0.1:6650"
            assert config.web_service_url == "http://10.0.0.1:8080"
            assert config.metadata_url == env["MAGNETAR_METADATA"]
        elif args.process == "autorecovery":
            # Reachable by the kubelet's probes and scrapers; named after its pod.
            assert (args.host, args.http_port) == ("0.0.0.0", 8010)
            assert args.metadata == env["MAGNETAR_METADATA"] and args.id == where.split()[0]


def test_grace_periods_cover_the_pre_stop_drain(rendered):
    _, objects = rendered
    broker = k8s.named(objects, "Deployment", "magnetar-broker")
    pod = k8s.pods(broker)[0]
    env = k8s.resolve_env(pod.container, objects, pod_name=pod.name, pod_ip="10.0.0.1")
    argv = k8s.pre_stop_command(pod.container, env)
    args = cli.parse_command_line(argv[1:], env)
    assert (args.process, args.resource, args.action) == ("admin", "brokers", "drain")
    assert args.admin_url == f"http://127.0.0.1:{_port_number(pod.container, 'http')}"
    assert pod.spec["terminationGracePeriodSeconds"] >= args.request_timeout_s + 20


def test_prod_has_auth_on_for_every_role_and_no_secret_data():
    """prod: brokers authenticate and authorize, gateways authenticate (with a token of
    their own), bookies refuse adds and reads without a token of an allowed role, and
    brokers and auto-recovery present one; every key and token file named is mounted
    from the operator's Secret; the preStop drain carries a token; and the rendered
    output holds no Secret at all (no key material in the repository)."""
    from bookie.main import config_from_args as bookie_config
    from broker.main import config_from_args as broker_config, ledger_config_from_args
    from magnetar.autorecovery import ledger_config_from_args as recovery_ledger_config

    objects = k8s.render("prod")
    assert not [o for o in objects if o["kind"] == "Secret"]
    roles_seen = set()
    for where, argv, env in _magnetar_command_lines(objects):
        args = cli.parse_command_line(argv, env)
        workload = k8s.named(objects, "StatefulSet" if args.process == "bookie" else "Deployment",
                             f"magnetar-{args.process if args.process != 'admin' else 'broker'}")
        spec = workload["spec"]["template"]["spec"]
        mounts = {m["mountPath"]: m["name"] for c in spec["containers"] for m in c.get("volumeMounts", [])}
        secrets = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}

        def from_secret(path: str) -> None:
            path = path.removeprefix("file://")
            directory, name = path.rsplit("/", 1)
            secret = secrets[mounts[directory]]
            assert secret["secretName"] == "magnetar-auth", (where, path)
            assert name in {item["path"] for item in secret["items"]}, (where, path)

        if args.process == "broker":
            config, ledger = broker_config(args), ledger_config_from_args(args)
            assert config.auth.authentication_enabled and config.auth.authorization_enabled, where
            assert set(config.auth.superuser_roles.split(",")) == {"admin", "magnetar-gateway"}
            from_secret(config.auth.token_secret_key)
            from_secret(ledger.bookie_auth_token_file)
            if where.endswith("command"):
                # `magnetar shell` run in a broker pod (k8s/README.md) takes the same token.
                shell = cli.parse_command_line(["shell", "listbookies"], env)
                assert shell.bookie_auth_token_file == ledger.bookie_auth_token_file
        elif args.process == "bookie":
            security = bookie_config(args).security
            assert security.authentication_enabled, where
            from_secret(security.token_secret_key)
            assert set(security.allowed_roles.split(",")) == {"magnetar-broker", "magnetar-autorecovery"}
        elif args.process == "gateway":
            assert args.authentication_enabled, where
            from_secret(args.service_token_file)
        elif args.process == "autorecovery":
            from_secret(recovery_ledger_config(args).bookie_auth_token_file)
        elif args.process == "admin":
            assert args.token_file, where        # the preStop drain
            from_secret(args.token_file)
        roles_seen.add(args.process)
    assert roles_seen == {"bookie", "broker", "gateway", "autorecovery", "admin"}


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


def test_prod_has_tls_on_for_brokers_and_gateways():
    """prod: brokers serve pulsar+ssl:// on 6651 and HTTPS on 8443 (plain 6650/8080 kept
    for probes and in-cluster traffic), gateways serve HTTPS and are probed with HTTPS;
    every certificate and key file named resolves to an item of the operator's Secret
    magnetar-tls, mounted read-only with mode 0440; the broker Service and NetworkPolicy
    carry 6651 and 8443. dev stays plain."""
    from broker.main import config_from_args as broker_config

    objects = k8s.render("prod")
    assert not [o for o in objects if o["kind"] == "Secret"]
    roles_seen = set()
    for where, argv, env in _magnetar_command_lines(objects):
        args = cli.parse_command_line(argv, env)
        if args.process not in ("broker", "gateway"):
            continue
        workload = k8s.named(objects, "Deployment", f"magnetar-{args.process}")
        spec = workload["spec"]["template"]["spec"]
        container = spec["containers"][0]
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        secrets = {v["name"]: v["secret"] for v in spec.get("volumes", []) if "secret" in v}
        assert spec["securityContext"]["fsGroup"] == 10001, where

        def from_tls_secret(path: str) -> None:
            assert path, where
            directory, name = path.rsplit("/", 1)
            mount = mounts[directory]
            assert mount["readOnly"] is True, (where, path)
            secret = secrets[mount["name"]]
            assert secret["secretName"] == "magnetar-tls", (where, path)
            assert secret["defaultMode"] == 0o440, (where, path)
            assert name in {item["path"] for item in secret["items"]}, (where, path)

        if args.process == "broker":
            config = broker_config(args)
            assert config.tls.enabled and config.plain_ports_enabled, where
            assert (config.port, config.http_port, config.tls_port, config.http_tls_port) == (6650, 8080, 6651, 8443)
            assert config.service_url_tls == "pulsar+ssl://10.0.0.1:6651"
            assert config.web_service_url_tls == "https://10.0.0.1:8443"
            from_tls_secret(config.tls.cert_file)
            from_tls_secret(config.tls.key_file)
            assert {_port_number(container, name) for name in ("pulsar-tls", "https")} == {6651, 8443}
            # The probes stay on the plain HTTP port.
            assert {p["httpGet"].get("scheme", "HTTP") for p in _probes(container).values()} == {"HTTP"}
        else:
            assert args.tls_cert_file and args.tls_key_file, where
            from_tls_secret(args.tls_cert_file)
            from_tls_secret(args.tls_key_file)
            assert args.advertised_url.startswith("https://"), where
            assert {p["httpGet"].get("scheme") for p in _probes(container).values()} == {"HTTPS"}
            assert workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
        roles_seen.add(args.process)
    assert roles_seen == {"broker", "gateway"}

    service = k8s.named(objects, "Service", "magnetar-broker")
    assert {6650, 8080, 6651, 8443} <= {p["port"] for p in service["spec"]["ports"]}
    policy = k8s.named(objects, "NetworkPolicy", "magnetar-broker")
    open_to_all = {p["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for p in rule["ports"]}
    assert {6650, 8080, 6651, 8443} <= open_to_all

    for where, argv, env in _magnetar_command_lines(k8s.render("dev")):
        args = cli.parse_command_line(argv, env)
        if args.process in ("broker", "gateway"):
            assert not args.tls_cert_file, where


def test_network_policies_say_who_talks_to_whom(rendered):
    _, objects = rendered
    policies = {p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
                for p in k8s.by_kind(objects, "NetworkPolicy")}
    assert set(policies) == {"etcd", "bookie", "broker", "gateway", "autorecovery"}

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

    assert ingress_from("etcd", 2379) == {"broker", "bookie", "etcd", "autorecovery"}
    assert ingress_from("etcd", 2380) == {"etcd"}
    assert ingress_from("bookie", 3181) == {"broker", "autorecovery"}
    assert ingress_from("broker", 6650) is None       # clients, gateways
    assert ingress_from("gateway", 8081) is None      # clients
    assert ingress_from("autorecovery", 8010) is None     # scrapers

    def egress_to(source: str) -> set[tuple[str, int]]:
        return {(peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"], port["port"])
                for rule in policies[source]["spec"]["egress"] for peer in rule.get("to", [])
                for port in rule["ports"]}

    assert egress_to("autorecovery") == {("etcd", 2379), ("bookie", 3181)}
    for policy in policies.values():
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_procedure_commands_are_the_clis():
    """Every `magnetar` command a README procedure runs in a pod parses there, with that
    pod's environment, and every procedure of the README is one the tests know."""
    from tests.k8s_local import procedure

    text = (k8s.K8S / "README.md").read_text()
    titles = re.findall(r"^### (.+?)\s*$", text.split("## Procedures", 1)[1].split("\n## ", 1)[0], re.M)
    assert set(titles) == {"Add brokers", "Remove brokers", "Restart brokers", "Add bookies", "Decommission a bookie",
                           "Recover a bookie whose volume was lost"}
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
