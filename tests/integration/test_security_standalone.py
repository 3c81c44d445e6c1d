"""``magnetar standalone --auth`` as a user runs it.

Proves: it starts with authentication and authorization on and prints a superuser
token (also written, mode 0600, beside a secret key it made, mode 0600); the official
client with that token produces and consumes, and so does a user of --basic-auth-file
with AuthenticationBasic (a wrong password: AuthenticationError); without credentials
it gets AuthenticationError;
the admin CLI with the token file works and without it is refused; the bookies
accept only the brokers' service token (the run stores through them); and after the run
no log file of the data directory (etcd, bookie, broker, gateway) holds the token,
the key (raw or in base64) or the password.
"""

from __future__ import annotations

import asyncio
import base64
import glob
import json
import os
import signal
import stat

import bcrypt
import pulsar
import pytest

from tests.cluster import free_port, python_command, run_cli, unique

PASSWORD = "standalone pass phrase"


async def test_standalone_auth_prints_a_superuser_token_and_logs_no_secret(tmp_path):
    ports = {name: free_port() for name in ("etcd", "peer", "bookie", "http", "broker", "broker_http", "gateway",
                                                   "autorecovery")}
    data_dir = str(tmp_path / "standalone")
    # Basic users beside tokens: the superuser role as a user with a password.
    users_file = str(tmp_path / "users.htpasswd")
    with open(users_file, "wb") as handle:
        handle.write(b"admin:$2y$" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4))[4:] + b"\n")
    process = await asyncio.create_subprocess_exec(
        *python_command("standalone", "--auth", "--basic-auth-file", users_file, "--data-dir", data_dir,
                        "--bookies", "1", "--copies", "1",
                        "--etcd-port", str(ports["etcd"]), "--etcd-peer-port", str(ports["peer"]),
                        "--bookie-port-base", str(ports["bookie"]), "--bookie-http-port-base", str(ports["http"]),
                        "--broker-port", str(ports["broker"]), "--broker-http-port", str(ports["broker_http"]),
                        "--gateway-port", str(ports["gateway"]),
                        "--autorecovery-http-port", str(ports["autorecovery"])),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    assert process.stdout is not None
    ready: dict = {}
    output: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not ready or not any("Authentication is on" in line for line in output):
                line = (await process.stdout.readline()).decode()
                assert line, "standalone exited before it was ready:\n" + "".join(output)
                output.append(line)
                if "standalone ready" in line:
                    ready = json.loads(line)
            token_line = (await process.stdout.readline()).decode()
        token = token_line.strip()
        token_file = ready["superuser_token_file"]
        key_file = os.path.join(data_dir, "auth", "secret.key")
        with open(token_file) as handle:
            assert handle.read().strip() == token
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600

        def produce_and_consume(authentication):
            client = pulsar.Client(ready["service_url"], authentication=authentication, operation_timeout_seconds=10)
            try:
                topic = f"persistent://public/default/{unique('standalone-auth')}"
                consumer = client.subscribe(topic, "s")
                client.create_producer(topic).send(b"secret-free")
                return consumer.receive(timeout_millis=10_000).data()
            finally:
                client.close()

        assert await asyncio.to_thread(produce_and_consume, pulsar.AuthenticationToken(token)) == b"secret-free"
        assert await asyncio.to_thread(produce_and_consume, pulsar.AuthenticationBasic("admin", PASSWORD)) == \
            b"secret-free"
        with pytest.raises(pulsar.AuthenticationError):
            await asyncio.to_thread(produce_and_consume, pulsar.AuthenticationBasic("admin", "wrong"))
        with pytest.raises(pulsar.AuthenticationError):
            await asyncio.to_thread(produce_and_consume, None)
        code, out, err = await run_cli("admin", "--admin-url", ready["admin_url"], "--token-file", token_file,
                                       "tenants", "list")
        assert code == 0 and "public" in out, err
        code, _, err = await run_cli("admin", "--admin-url", ready["admin_url"], "tenants", "list")
        assert code == 1 and "401" in err
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await process.wait()
    with open(key_file, "rb") as handle:
        key = handle.read()
    with open(os.path.join(data_dir, "auth", "broker.token"), "rb") as handle:
        broker_token = handle.read().strip()
    logs = glob.glob(os.path.join(data_dir, "**", "*.log"), recursive=True)
    assert len(logs) >= 4, logs   # etcd, bookie, broker, gateway
    for path in logs:
        with open(path, "rb") as handle:
            content = handle.read()
        for secret in (token.encode(), broker_token, key, base64.b64encode(key), base64.urlsafe_b64encode(key),
                       PASSWORD.encode()):
            assert secret not in content, path
