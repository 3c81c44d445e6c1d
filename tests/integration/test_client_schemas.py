"""Schemas through the official Pulsar client (pulsar-client) and the admin REST API, on
the module cluster of test_client_features' kind (etcd, three bookies, one broker).

Proves: a JSON-schema producer registers version 0 and a JSON-schema consumer reads the
typed value; under BACKWARD a schema that drops a field becomes version 1, one that
changes a field's type is refused with IncompatibleSchema (for producers and
consumers), and the admin compatibility check agrees; under the default FULL the
dropped field is refused; ALWAYS_COMPATIBLE takes anything; the admin endpoints list,
read by version, register and delete schemas.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pulsar
import pytest
from pulsar.schema import Integer, JsonSchema, Record, String

from tests.cluster import unique

RECEIVE_TIMEOUT_MS = 10_000


def _admin(cluster, method: str, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{cluster.brokers[0].web_service_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=15) as response:
        text = response.read()
    return json.loads(text) if text else None


def _versions():
    class Order(Record):
        name = String()
        qty = Integer()
        note = String()

    class OrderWithoutNote(Record):
        name = String()
        qty = Integer()

    class OrderQtyText(Record):
        name = String()
        qty = String()

    # One record name, as one class evolving would have.
    OrderWithoutNote.__name__ = OrderQtyText.__name__ = "Order"
    return Order, OrderWithoutNote, OrderQtyText


def _namespace(cluster, strategy: str | None) -> str:
    namespace = unique("schemas")
    _admin(cluster, "PUT", f"/admin/v2/namespaces/public/{namespace}")
    if strategy is not None:
        _admin(cluster, "PUT", f"/admin/v2/namespaces/public/{namespace}/schemaCompatibilityStrategy", strategy)
    return namespace


def test_json_schema_evolution_under_backward(pulsar_cluster, client):
    order, without_note, qty_text = _versions()
    namespace = _namespace(pulsar_cluster, "BACKWARD")
    local = unique("orders")
    topic = f"persistent://public/{namespace}/{local}"
    path = f"/admin/v2/schemas/public/{namespace}/{local}"
    consumer = client.subscribe(topic, "sub", schema=JsonSchema(order))
    producer = client.create_producer(topic, schema=JsonSchema(order))
    producer.send(order(name="apple", qty=3, note="fresh"))
    message = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
    assert (message.value().name, message.value().qty) == ("apple", 3)
    latest = _admin(pulsar_cluster, "GET", f"{path}/schema")
    assert (latest["version"], latest["type"]) == (0, "JSON")
    assert json.loads(latest["data"])["fields"][2]["name"] == "note"

    evolved = client.create_producer(topic, schema=JsonSchema(without_note))
    evolved.send(without_note(name="pear", qty=1))
    assert [v["version"] for v in _admin(pulsar_cluster, "GET", f"{path}/schemas")["getSchemaResponses"]] == [0, 1]
    assert _admin(pulsar_cluster, "GET", f"{path}/schema/1")["version"] == 1

    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=JsonSchema(qty_text))
    with pytest.raises(pulsar.IncompatibleSchema):
        client.subscribe(topic, "typed-wrong", schema=JsonSchema(qty_text))
    check = _admin(pulsar_cluster, "POST", f"{path}/compatibility",
                   {"type": "JSON", "schema": JsonSchema(qty_text).schema_info().schema(), "properties": {}})
    assert check == {"isCompatible": False, "schemaCompatibilityStrategy": "BACKWARD"}
    for closable in (consumer, producer, evolved):
        closable.close()


def test_strategies_full_and_always_compatible_and_admin_register_delete(pulsar_cluster, client):
    order, without_note, qty_text = _versions()
    full = f"persistent://public/{_namespace(pulsar_cluster, None)}/{unique('orders')}"
    client.create_producer(full, schema=JsonSchema(order)).close()
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(full, schema=JsonSchema(without_note))   # FULL: old readers need "note"

    namespace = _namespace(pulsar_cluster, "ALWAYS_COMPATIBLE")
    local = unique("anything")
    path = f"/admin/v2/schemas/public/{namespace}/{local}"
    registered = _admin(pulsar_cluster, "POST", f"{path}/schema",
                        {"type": "JSON", "schema": JsonSchema(order).schema_info().schema(), "properties": {"a": "b"}})
    assert registered == {"version": 0}
    producer = client.create_producer(f"persistent://public/{namespace}/{local}", schema=JsonSchema(qty_text))
    producer.close()
    assert len(_admin(pulsar_cluster, "GET", f"{path}/schemas")["getSchemaResponses"]) == 2
    assert _admin(pulsar_cluster, "GET", f"{path}/schema/0")["properties"] == {"a": "b"}
    _admin(pulsar_cluster, "DELETE", f"{path}/schema")
    with pytest.raises(urllib.error.HTTPError) as raised:
        _admin(pulsar_cluster, "GET", f"{path}/schema")
    assert raised.value.code == 404
