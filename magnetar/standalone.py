"""``magnetar standalone``: a whole cluster on this machine, data under one directory.

It runs etcd, the bookies, the brokers and an HTTP gateway as child processes (real processes, as in production),
waits for each to be ready, prints how to reach them, and stops them all on SIGTERM or
Ctrl-C. Data survives restarts: the same ``--data-dir`` brings back the same cluster.

Supervision (as a process supervisor would): when a child dies on its own after the
standalone is up, the standalone logs it (name, pid, exit code) and starts it again
with the same command, ports and directories, after a back-off that doubles from
``RESTART_DELAY_S`` to ``RESTART_DELAY_S_MAX`` while it keeps failing (at start, or again
within ``STABLE_S`` of a start) and is forgotten once it has stayed up ``STABLE_S``. So a ``kill -9`` of one broker of ``--brokers 3`` is a
failover one can watch: its bundles go to the others once its etcd lease expires, and
it comes back. The standalone itself stops only on SIGTERM / Ctrl-C, or when a child
fails ``START_ATTEMPTS_MAX`` starts in a row (exits before it is ready, or is not ready
in time): then it logs why, stops the others and exits 1 (loud, rather than restart
forever what cannot start). The exception is a bookie while the bookies still up can
hold every copy (``--bookies`` minus those down is at least ``--copies``): a bookie
whose disks are gone (its cookie check refuses to start it) is left down, logged, and
the cluster goes on; its auto-recovery child makes the lost copies again on the others
once the bookie has been gone its grace period. At first start any child that fails
stops everything, as before: a cluster that never came up is the operator's to look at.

Layout of the data directory:
    etcd/                      etcd's data
    bookie-<n>/journal/        bookie n's journal
    bookie-<n>/ledgers/        bookie n's ledger directory
    gateway.secret             the secret that signs the gateway's receipts (made once, 0600)
    auth/secret.key            with --auth and no key given: the token secret key (made once, 0600)
    auth/superuser.token       with --auth: a token of the superuser role (0600), also printed
    auth/broker.token          with --auth: the brokers' service token toward the bookies and
                               each other (0600)
    *.log                      each process's log

The broker keeps no data of its own (everything is in etcd and the bookies).

Children die with the standalone, however it dies: each is started with
PR_SET_PDEATHSIG = SIGKILL (Linux), so a ``kill -9`` of the standalone does not leave a
broker holding 6650 and 8080 (or bookies, or etcd, a Go binary: the setting survives
exec) for the next ``make run`` to trip over. A clean stop (SIGTERM, Ctrl-C) still stops
them in order first.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from typing import Callable

from magnetar.etcd_server import etcd_command, etcd_is_healthy
from common.errors import ConfigError, PortInUse
from runtime.tasks import stop_on_signals

log = logging.getLogger(__name__)

# prctl(2): the signal a process gets when the thread that forked it exits.
_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child may only make the prctl call, not load a library.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_this_process() -> Callable[[], None]:
    """A preexec_fn making the child get SIGKILL when this process dies (Linux). The
    forking thread is the event loop's (asyncio starts children from it), which lives
    as long as the process. If this process died between fork and prctl, the child
    kills itself at once rather than run without a parent."""
    parent_pid = os.getpid()

    def preexec() -> None:
        if _LIBC is None:
            return
        if _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


READY_TIMEOUT_S = 60.0
# With --auth: the role brokers present to bookies (only it may add and read).
STANDALONE_BROKER_ROLE = "standalone-broker"
# One readiness probe; a child that answers at all answers a local GET well within it.
PROBE_TIMEOUT_S = 1.0
# Restarts: the first after half a second (a crashed broker's port is free at once), then
# doubling to 10 s, so a child that dies in a loop costs little; after STABLE_S up the
# count starts again. START_ATTEMPTS_MAX failed starts in a row (each up to
# READY_TIMEOUT_S, with the back-offs: about 5 minutes at worst) end the standalone.
RESTART_DELAY_S = 0.5
RESTART_DELAY_S_MAX = 10.0
STABLE_S = 30.0
START_ATTEMPTS_MAX = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default="data/standalone")
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--etcd-port", type=int, default=2379)
    parser.add_argument("--etcd-peer-port", type=int, default=2380)
    parser.add_argument("--bookie-port-base", type=int, default=3181, help="bookie n listens on base + n")
    parser.add_argument("--bookie-http-port-base", type=int, default=8001)
    parser.add_argument("--broker-port", type=int, default=6650, help="Pulsar binary protocol")
    parser.add_argument("--broker-http-port", type=int, default=8080, help="admin REST, lookups, /metrics")
    parser.add_argument("--brokers", type=int, default=1,
                        help="brokers sharing the bookies (broker n on broker-port + n, broker-http-port + n)")
    parser.add_argument("--copies", type=int, default=2, choices=[1, 2, 3],
                        help="bookies each message is stored on (E=Qw=Qa), default 2")
    parser.add_argument("--gateway-port", type=int, default=8081,
                        help="the HTTP gateway (broker HTTP ports skip it)")
    parser.add_argument("--autorecovery-http-port", type=int, default=8010,
                        help="the auto-recovery process (re-replicates a lost bookie's copies, collects orphan "
                             "ledgers): /health and /metrics")
    # Security (off by default, like Pulsar standalone).
    parser.add_argument("--auth", action="store_true",
                        help="token authentication and authorization on the brokers and the gateway; prints a "
                             "superuser token")
    parser.add_argument("--superuser-role", default="admin", help="with --auth: the superuser role")
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--token-secret-key", default=None,
                      help="with --auth: an HS256 secret key file (default: one made in the data directory)")
    keys.add_argument("--token-private-key", default=None,
                      help="with --auth: an RS256 private key file (with --token-public-key): the standalone "
                           "signs the superuser token with it; brokers get only the public key")
    parser.add_argument("--token-public-key", default=None, help="with --auth and --token-private-key")
    parser.add_argument("--basic-auth-file", default=None,
                        help="with --auth: an htpasswd file (bcrypt hashes, htpasswd -B): brokers and the "
                             "gateway accept its users (basic authentication) beside tokens")
    parser.add_argument("--superuser-roles", default="",
                        help="with --auth: more comma-separated superuser roles beside --superuser-role (e.g. "
                             "the CN of an operator's client certificate, a basic user)")
    parser.add_argument("--anonymous-role", default="",
                        help="with --auth: the role of clients presenting no credentials (Pulsar's "
                             "anonymousUserRole; the official clients without authentication send the method "
                             "'none'); default: such clients are refused")
    parser.add_argument("--authentication-providers", default=None,
                        help="with --auth: the brokers' providers, comma-separated among token, basic, tls "
                             "(default: token, plus basic with --basic-auth-file, plus tls with "
                             "--tls-trust-certs-file)")
    # TLS on the brokers' listeners, beside the plain ones (as Pulsar's brokerServicePortTls
    # and webServicePortTls beside brokerServicePort and webServicePort).
    parser.add_argument("--tls-cert-file", default=None,
                        help="a PEM certificate (chain) for the brokers: turns on pulsar+ssl:// and HTTPS beside "
                             "the plain ports")
    parser.add_argument("--tls-key-file", default=None, help="with --tls-cert-file: its PEM private key")
    parser.add_argument("--tls-trust-certs-file", default=None,
                        help="with --tls-cert-file: the CA certificates client certificates are checked against "
                             "(needed by the tls provider)")
    parser.add_argument("--broker-tls-port", type=int, default=6651,
                        help="with --tls-cert-file: pulsar+ssl:// (broker n on this + n)")
    parser.add_argument("--broker-https-port", type=int, default=8443,
                        help="with --tls-cert-file: HTTPS admin REST and lookups (broker n on this + n)")


class StartFailed(Exception):
    """A child exited or did not become ready while the standalone started."""


class Child:
    """One supervised child: how to start it and tell it is ready, its current
    process, and its restart history."""

    def __init__(self, name: str, command: list[str], ready_url: str, env: dict[str, str] | None = None,
                 healthy: Callable[[bytes], bool] = lambda body: True) -> None:
        self.name = name
        self.command = command
        self.ready_url = ready_url
        self.env = env
        self.healthy = healthy
        self.process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.failed_starts = 0     # in a row
        # Exits within STABLE_S of a start, in a row: they lengthen the back-off (a
        # child that crashes soon after it is ready is restarted ever more slowly, up
        # to RESTART_DELAY_S_MAX) but do not end the standalone: it did start.
        self.quick_exits = 0
        # A bookie may be left down after START_ATTEMPTS_MAX failed starts (the others
        # hold the copies and auto-recovery restores them) instead of ending the standalone.
        self.may_stay_down = False
        self.left_down = False


class Standalone:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data_dir = os.path.abspath(args.data_dir)
        self.children: list[Child] = []
        self.stopping = asyncio.Event()
        # Set when a child kept failing at start: the reason the standalone exits 1.
        self.gave_up: str | None = None

    @property
    def metadata_url(self) -> str:
        return f"etcd://127.0.0.1:{self.args.etcd_port}"

    def broker_http_port(self, n: int) -> int:
        """Broker n's HTTP port: broker-http-port + n, stepping over the gateway's."""
        ports = []
        port = self.args.broker_http_port
        while len(ports) <= n:
            if port != self.args.gateway_port:
                ports.append(port)
            port += 1
        return ports[n]

    def gateway_secret(self) -> str:
        """The receipt secret, made once per data directory so receipts survive a
        restart of the standalone (readable by this user only)."""
        path = os.path.join(self.data_dir, "gateway.secret")
        if not os.path.exists(path):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(f"standalone:{secrets.token_hex(32)}\n")
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()

    def _private_file(self, name: str, data: bytes, *, replace: bool) -> str:
        """``data`` in data_dir/auth/``name``, readable by this user only."""
        directory = os.path.join(self.data_dir, "auth")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        path = os.path.join(directory, name)
        if replace or not os.path.exists(path):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
        return path

    def auth_setup(self) -> tuple[list[str], list[str], str, str]:
        """(the bookies' auth flags, the brokers' auth flags, the superuser token file,
        the brokers' service token file) for --auth. Brokers (and the auto-recovery
        process) reach the bookies with a service token of the brokers' role.
        Keys and tokens are passed as files, never on a command line or in a log."""
        from runtime.tokens import TokenSigner, create_secret_key, read_key_value

        args = self.args
        role = args.superuser_role
        if args.token_private_key:
            if not args.token_public_key:
                raise StartFailed("--token-private-key needs --token-public-key")
            signer = TokenSigner.with_private_key(read_key_value(args.token_private_key))
            key_flags = ["--token-public-key", "file://" + os.path.abspath(args.token_public_key)]
        else:
            key_path = (os.path.abspath(args.token_secret_key) if args.token_secret_key
                        else self._private_file("secret.key", create_secret_key(), replace=False))
            signer = TokenSigner.with_secret_key(read_key_value(key_path))
            key_flags = ["--token-secret-key", "file://" + key_path]
        token_path = self._private_file("superuser.token", signer.create(role).encode(), replace=True)
        broker_token_path = self._private_file("broker.token", signer.create(STANDALONE_BROKER_ROLE).encode(),
                                               replace=True)
        bookie_flags = ["--authentication-enabled", *key_flags, "--allowed-roles", STANDALONE_BROKER_ROLE]
        # The brokers' role is also a superuser of theirs, and its token what they present
        # to each other (an admin request's calls on partitions another broker serves).
        broker_flags = ["--authentication-enabled", "--authorization-enabled",
                        "--superuser-roles", self.superuser_roles(), *key_flags,
                        "--bookie-auth-token-file", broker_token_path, "--broker-client-token-file", broker_token_path]
        if args.basic_auth_file:
            broker_flags += ["--basic-auth-file", "file://" + os.path.abspath(args.basic_auth_file)]
        if args.anonymous_role:
            broker_flags += ["--anonymous-role", args.anonymous_role]
        broker_flags += ["--authentication-providers", ",".join(self.broker_providers())]
        return bookie_flags, broker_flags, token_path, broker_token_path

    def superuser_roles(self) -> str:
        extra = [role.strip() for role in self.args.superuser_roles.split(",") if role.strip()]
        return ",".join(dict.fromkeys([self.args.superuser_role, STANDALONE_BROKER_ROLE, *extra]))

    def broker_providers(self) -> list[str]:
        """The brokers' authentication providers (--auth): as given, or token plus what
        the files given make possible."""
        args = self.args
        if args.authentication_providers:
            providers = [name.strip() for name in args.authentication_providers.split(",") if name.strip()]
            if "token" not in providers:
                # The standalone's own parts (gateway, brokers toward each other) use tokens.
                raise StartFailed("--authentication-providers must include token (the standalone's gateway and "
                                  "brokers present tokens)")
            if "basic" in providers and not args.basic_auth_file:
                raise StartFailed("the basic provider needs --basic-auth-file")
            if "tls" in providers and not args.tls_trust_certs_file:
                raise StartFailed("the tls provider needs --tls-cert-file, --tls-key-file and --tls-trust-certs-file")
            return providers
        return ["token", *(["basic"] if args.basic_auth_file else []),
                *(["tls"] if args.tls_trust_certs_file else [])]

    def provider_flags(self) -> list[str]:
        """The gateway's authentication providers (--auth): the brokers' but tls (the
        gateway the standalone starts serves plain HTTP, where no client certificate is)."""
        return ["--authentication-providers", ",".join(name for name in self.broker_providers() if name != "tls")]

    def tls_flags(self, n: int) -> list[str]:
        """Broker n's TLS flags (--tls-cert-file): pulsar+ssl:// and HTTPS beside the plain ports."""
        args = self.args
        if not args.tls_cert_file:
            return []
        flags = ["--tls-cert-file", os.path.abspath(args.tls_cert_file),
                 "--tls-key-file", os.path.abspath(args.tls_key_file),
                 "--tls-port", str(args.broker_tls_port + n), "--http-tls-port", str(args.broker_https_port + n)]
        if args.tls_trust_certs_file:
            flags += ["--tls-trust-certs-file", os.path.abspath(args.tls_trust_certs_file)]
        return flags

    def check_tls_arguments(self) -> None:
        args = self.args
        if bool(args.tls_cert_file) != bool(args.tls_key_file):
            raise ConfigError("--tls-cert-file and --tls-key-file go together")
        if args.tls_trust_certs_file and not args.tls_cert_file:
            raise ConfigError("--tls-trust-certs-file needs --tls-cert-file and --tls-key-file")
        for flag, value in (("--tls-cert-file", args.tls_cert_file), ("--tls-key-file", args.tls_key_file),
                            ("--tls-trust-certs-file", args.tls_trust_certs_file)):
            if value and not os.path.isfile(value):
                raise ConfigError(f"{flag} {value}: no such file")
        if not args.auth and (args.anonymous_role or args.superuser_roles or args.authentication_providers):
            raise ConfigError("--anonymous-role, --superuser-roles and --authentication-providers need --auth")

    async def _spawn(self, child: Child) -> asyncio.subprocess.Process:
        log_path = os.path.join(self.data_dir, f"{child.name}.log")
        log_file = open(log_path, "ab")
        try:
            process = await asyncio.create_subprocess_exec(*child.command, stdout=log_file, stderr=log_file,
                                                           start_new_session=True, env=child.env,
                                                           preexec_fn=die_with_this_process())
        finally:
            log_file.close()
        child.process = process
        child.started_at = time.monotonic()
        if child not in self.children:
            self.children.append(child)
        log.info("started: process=%s pid=%d log=%s", child.name, process.pid, log_path)
        return process

    async def _start_child(self, child: Child) -> None:
        """Starts ``child`` and waits until it is ready (StartFailed if it is not)."""
        process = await self._spawn(child)
        await self._wait_http_ok(child.name, child.ready_url, process, healthy=child.healthy)

    async def _wait_http_ok(self, name: str, url: str, process: asyncio.subprocess.Process,
                            healthy=lambda body: True) -> None:
        """Polls ``url`` until it answers 200 (and ``healthy(body)``), watching the child:
        one that exits fails the start at once, with its exit code, not after the timeout."""
        def probe() -> bytes | None:
            try:
                with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
                    return response.read() if response.status == 200 else None
            except (urllib.error.URLError, OSError):   # not listening yet, or 503 while starting
                return None

        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise StartFailed(f"{name} exited with code {process.returncode}; see {self.data_dir}/{name}.log")
            body = await asyncio.to_thread(probe)
            if body is not None and healthy(body):
                if process.returncode is not None:   # it answered, but it is gone: not ours
                    raise StartFailed(f"{name} exited with code {process.returncode}; "
                                      f"see {self.data_dir}/{name}.log")
                return
            await asyncio.sleep(0.2)
        raise StartFailed(f"{name} not ready after {READY_TIMEOUT_S}s ({url}); see {self.data_dir}/{name}.log")

    def _ports(self) -> list[tuple[str, int, str]]:
        """(what, port, the flag that sets it) of every port the standalone uses."""
        args = self.args
        ports = [("etcd", args.etcd_port, "--etcd-port"), ("etcd peer", args.etcd_peer_port, "--etcd-peer-port")]
        for n in range(args.bookies):
            ports += [(f"bookie-{n}", args.bookie_port_base + n, "--bookie-port-base"),
                      (f"bookie-{n} http", args.bookie_http_port_base + n, "--bookie-http-port-base")]
        for n in range(args.brokers):
            ports += [(f"broker-{n}", args.broker_port + n, "--broker-port"),
                      (f"broker-{n} http", self.broker_http_port(n), "--broker-http-port")]
            if args.tls_cert_file:
                ports += [(f"broker-{n} tls", args.broker_tls_port + n, "--broker-tls-port"),
                          (f"broker-{n} https", args.broker_https_port + n, "--broker-https-port")]
        ports.append(("gateway", args.gateway_port, "--gateway-port"))
        ports.append(("autorecovery", args.autorecovery_http_port, "--autorecovery-http-port"))
        return ports

    def _check_ports_free(self) -> None:
        """Something already listening on one of our ports would answer our readiness
        probes in our child's place (a stray etcd on 2379 would be used silently, and
        our own etcd would die): refuse to start, naming the port and its flag."""
        taken: dict[int, str] = {}
        for name, port, flag in self._ports():
            if port in taken:
                raise ConfigError(f"port {port} ({flag} {port}) is also {taken[port]}'s: give each part its own port")
            taken[port] = name
        for name, port, flag in self._ports():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(PROBE_TIMEOUT_S)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    raise PortInUse(flag, "127.0.0.1", port, f"already in use ({name}): another standalone or "
                                                             "etcd running?")

    async def start(self) -> None:
        self.check_tls_arguments()
        os.makedirs(self.data_dir, exist_ok=True)
        self._check_ports_free()
        await self._start_child(Child(
            "etcd", etcd_command(os.path.join(self.data_dir, "etcd"), self.args.etcd_port, self.args.etcd_peer_port),
            f"http://127.0.0.1:{self.args.etcd_port}/health", healthy=etcd_is_healthy))
        bookie_auth_flags, auth_flags, token_path, broker_token_path = \
            self.auth_setup() if self.args.auth else ([], [], "", "")
        bookies = []
        for n in range(self.args.bookies):
            directory = os.path.join(self.data_dir, f"bookie-{n}")
            http_port = self.args.bookie_http_port_base + n
            command = [sys.executable, "-m", "magnetar", "bookie", "--metadata", self.metadata_url,
                       "--journal-dir", os.path.join(directory, "journal"),
                       "--ledger-dir", os.path.join(directory, "ledgers"),
                       "--port", str(self.args.bookie_port_base + n), "--http-port", str(http_port),
                       # Adds without gRPC (bookie/add_socket.py) on a free port, which the
                       # bookie registers; the brokers and auto-recovery use it.
                       "--add-socket-port", "0", *bookie_auth_flags]
            child = Child(f"bookie-{n}", command, f"http://127.0.0.1:{http_port}/health")
            child.may_stay_down = True
            await self._spawn(child)
            bookies.append(child)
        for child in bookies:
            assert child.process is not None
            await self._wait_http_ok(child.name, child.ready_url, child.process)
        copies = min(self.args.copies, self.args.bookies)
        brokers = []
        for n in range(self.args.brokers):
            name = "broker" if n == 0 else f"broker-{n}"
            child = Child(name, [
                sys.executable, "-m", "magnetar", "broker", "--metadata", self.metadata_url,
                "--port", str(self.args.broker_port + n), "--http-port", str(self.broker_http_port(n)),
                "--broker-id", f"broker-{n}", "--bookie-add-transport", "socket",
                "--ensemble-size", str(copies), "--write-quorum", str(copies), "--ack-quorum", str(copies),
                # Where namespaces with an offload policy archive closed ledgers (docs/archive.md).
                "--archive-url", os.path.join(self.data_dir, "archive"), *auth_flags, *self.tls_flags(n)],
                f"http://127.0.0.1:{self.broker_http_port(n)}/health")
            await self._spawn(child)
            brokers.append(child)
        for child in brokers:
            assert child.process is not None
            await self._wait_http_ok(child.name, child.ready_url, child.process)
        # Re-replication of a lost bookie's copies and the orphan-ledger collector
        # (magnetar/autorecovery.py): one process, as a cluster runs one or more.
        await self._start_child(Child("autorecovery", [
            sys.executable, "-m", "magnetar", "autorecovery", "--metadata", self.metadata_url,
            "--http-port", str(self.args.autorecovery_http_port), "--bookie-add-transport", "socket",
            *(["--bookie-auth-token-file", broker_token_path] if broker_token_path else [])],
            f"http://127.0.0.1:{self.args.autorecovery_http_port}/health"))
        service_url = "pulsar://" + ",".join(f"127.0.0.1:{self.args.broker_port + n}"
                                             for n in range(self.args.brokers))
        admin_url = f"http://127.0.0.1:{self.args.broker_http_port}"
        tls_urls = {}
        if self.args.tls_cert_file:
            tls_urls = {"service_url_tls": "pulsar+ssl://" + ",".join(
                            f"localhost:{self.args.broker_tls_port + n}" for n in range(self.args.brokers)),
                        "admin_url_tls": f"https://localhost:{self.args.broker_https_port}"}
        gateway_url = f"http://127.0.0.1:{self.args.gateway_port}"
        # The secret goes in the environment, never on the command line (ps shows that).
        await self._start_child(Child("gateway", [
            sys.executable, "-m", "magnetar", "gateway", "--service-url", service_url, "--admin-url", admin_url,
            "--port", str(self.args.gateway_port),
            *(["--authentication-enabled", "--service-token-file", token_path, *self.provider_flags()]
              if token_path else [])],
            f"{gateway_url}/health",
            env={**os.environ, "MAGNETAR_GATEWAY_SECRET": self.gateway_secret()}))
        print(json.dumps({
            "event": "standalone ready",
            "metadata": self.metadata_url,
            "bookies": [f"127.0.0.1:{self.args.bookie_port_base + n}" for n in range(self.args.bookies)],
            "service_url": service_url,
            "admin_url": admin_url,
            **tls_urls,
            "gateway_url": gateway_url,
            "autorecovery_url": f"http://127.0.0.1:{self.args.autorecovery_http_port}",
            "archive_url": os.path.join(self.data_dir, "archive"),
            "data_dir": self.data_dir,
            "auth": bool(token_path),
            "authentication_providers": self.broker_providers() if token_path else [],
            "anonymous_role": self.args.anonymous_role,
            "superuser_token_file": token_path,
        }), flush=True)
        if token_path:
            with open(token_path, encoding="ascii") as handle:
                token = handle.read().strip()
            print(f"Authentication is on. Superuser role {self.args.superuser_role!r}, token (also in "
                  f"{token_path}):\n  {token}\nClients: pulsar.AuthenticationToken(token); tools: "
                  f"--token-file {token_path}; HTTP: Authorization: Bearer <token>.", flush=True)
            print(f"Providers: {', '.join(self.broker_providers())}; clients without credentials: "
                  + (f"role {self.args.anonymous_role!r} (its grants apply)." if self.args.anonymous_role
                     else "refused (no --anonymous-role)."), flush=True)
        if tls_urls:
            print(f"TLS: {tls_urls['service_url_tls']} and {tls_urls['admin_url_tls']} (beside the plain ports); "
                  f"clients trust {self.args.tls_trust_certs_file or 'the CA of --tls-cert-file'}.", flush=True)
        print(f"Magnetar standalone is up: {service_url} (Pulsar clients), {admin_url} (admin REST), "
              f"{gateway_url} (HTTP gateway). Try:\n"
              f"  magnetar produce --service-url {service_url} my-topic -m hello\n"
              f"  magnetar consume --service-url {service_url} my-topic -s my-sub --initial-position earliest -n 1\n"
              f"  magnetar admin --admin-url {admin_url} topics list public/default\n"
              f"  magnetar shell --metadata {self.metadata_url} listbookies\n"
              f"  curl -X POST {gateway_url}/v1/topics/persistent/public/default/my-topic/message "
              f"-d '{{\"payload\": \"hello\"}}'\n"
              f"Logs are in {self.data_dir}/*.log. Ctrl-C stops everything.", flush=True)

    async def watch_children(self) -> int:
        """Supervises every child until SIGTERM / Ctrl-C (0) or until one keeps failing
        at start (1). One task per child, owned here: cancelled and awaited on the way out."""
        supervisors = [asyncio.ensure_future(self._supervise(child)) for child in self.children]
        try:
            await self.stopping.wait()
        finally:
            for task in supervisors:
                task.cancel()
            await asyncio.gather(*supervisors, return_exceptions=True)
        if self.gave_up is not None:
            log.error("standalone stopping: %s", self.gave_up)
            print(f"magnetar standalone: {self.gave_up}", file=sys.stderr, flush=True)
            return 1
        return 0

    async def _supervise(self, child: Child) -> None:
        """Restarts ``child`` whenever it exits, with back-off; gives the standalone up
        (``gave_up``, ``stopping``) after START_ATTEMPTS_MAX failed starts in a row."""
        while not self.stopping.is_set():
            process = child.process
            assert process is not None
            code = await process.wait()
            if self.stopping.is_set():
                return
            up_s = time.monotonic() - child.started_at
            if up_s >= STABLE_S:
                child.failed_starts = 0
                child.quick_exits = 0
            else:
                child.quick_exits += 1
            log.error("child exited on its own, restarting it: process=%s pid=%d code=%s up_s=%.1f restarts=%d",
                      child.name, process.pid, code, up_s, child.restarts)
            while not self.stopping.is_set():
                level = min(child.failed_starts + max(child.quick_exits - 1, 0), 16)
                delay_s = min(RESTART_DELAY_S * 2 ** level, RESTART_DELAY_S_MAX)
                await asyncio.sleep(delay_s)
                child.restarts += 1
                try:
                    await self._start_child(child)
                except StartFailed as error:
                    child.failed_starts += 1
                    log.error("restart failed: process=%s attempt=%d of %d error=%s", child.name,
                              child.failed_starts, START_ATTEMPTS_MAX, error)
                    if child.process is not None and child.process.returncode is None:
                        child.process.kill()
                        await child.process.wait()
                    if child.failed_starts >= START_ATTEMPTS_MAX and self._can_leave_down(child):
                        child.left_down = True
                        log.error("child left down after %d failed starts in a row; the other bookies hold the "
                                  "copies and auto-recovery makes its copies again on them after its grace "
                                  "period; a bookie whose disks were lost also refuses to start on its cookie "
                                  "(README.md: what make run starts): process=%s log=%s/%s.log",
                                  child.failed_starts, child.name, self.data_dir, child.name)
                        return
                    if child.failed_starts >= START_ATTEMPTS_MAX:
                        self.gave_up = (f"{child.name} failed {child.failed_starts} starts in a row; "
                                        f"see {self.data_dir}/{child.name}.log")
                        self.stopping.set()
                        return
                    continue
                log.warning("child restarted: process=%s pid=%d restarts=%d", child.name,
                            child.process.pid if child.process else -1, child.restarts)
                break

    def _can_leave_down(self, child: Child) -> bool:
        """Whether ``child`` (a bookie) may stay down: the bookies still up can hold
        every copy of an entry (--copies of them)."""
        if not child.may_stay_down:
            return False
        bookies = [c for c in self.children if c.may_stay_down]
        up = sum(1 for c in bookies if c is not child and not c.left_down)
        return up >= min(self.args.copies, len(bookies))

    async def stop(self) -> None:
        # Gateway first (its consumers close), then the brokers (they close topics and
        # flush cursors), then bookies (they flush and checkpoint), etcd last: children
        # were started in the opposite order.
        for child in reversed(self.children):
            process = child.process
            if process is not None and process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    async with asyncio.timeout(20):
                        await process.wait()
                except TimeoutError:
                    log.warning("child did not stop in time, killing: process=%s", child.name)
                    process.kill()
                    await process.wait()


def main(args: argparse.Namespace) -> int:
    async def run() -> int:
        standalone = Standalone(args)
        stop_on_signals(standalone.stopping)
        try:
            await standalone.start()
            return await standalone.watch_children()
        finally:
            await standalone.stop()

    try:
        return asyncio.run(run())
    except StartFailed as error:
        # A child that would not start: one line saying which and where its log is.
        print(f"magnetar standalone: {error}", file=sys.stderr)
        return 1
