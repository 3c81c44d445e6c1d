"""Locust users of the HTTP gateway: each produces batches of 10 messages and pulls and
acks what it gets (a work queue on one shared subscription). Run by
bench/gateway_load.py (``make bench-gateway``) headless, 50 users for 60 s; the topic and
subscription come from the environment (GATEWAY_TOPIC_PATH, GATEWAY_SUBSCRIPTION)."""

from __future__ import annotations

import os

from locust import HttpUser, between, task

TOPIC_PATH = os.environ.get("GATEWAY_TOPIC_PATH", "persistent/public/default/locust")
SUBSCRIPTION = os.environ.get("GATEWAY_SUBSCRIPTION", "locust")
BATCH = [{"payload": "x" * 256, "properties": {"source": "locust"}}] * 10


class GatewayUser(HttpUser):
    wait_time = between(0.0, 0.05)

    @task
    def produce(self) -> None:
        with self.client.post(f"/v1/topics/{TOPIC_PATH}/messages", json={"messages": BATCH},
                              name="produce 10", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
            elif any(r["status"] != "stored" for r in response.json()["results"]):
                response.failure("a message was not stored")

    @task
    def pull_and_ack(self) -> None:
        base = f"/v1/topics/{TOPIC_PATH}/subscriptions/{SUBSCRIPTION}"
        with self.client.post(f"{base}/pull", json={"max_messages": 10, "wait_ms": 500, "lease_ms": 30_000},
                              name="pull 10", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            messages = response.json()["messages"]
        if not messages:
            return
        with self.client.post(f"{base}/ack", json={"receipts": [m["receipt"] for m in messages]},
                              name="ack", catch_response=True) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
            elif any(r["status"] != "acked" for r in response.json()["results"]):
                response.failure("a receipt was not acked")
