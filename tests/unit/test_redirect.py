"""Where a hand-over sends its clients (broker/redirect.py) and the CLOSE_* commands
that carry it (protocol/commands.py): pure."""

from __future__ import annotations

from broker.redirect import Destination
from protocol import commands


def test_without_listeners_clients_go_to_the_service_urls():
    destination = Destination("pulsar://b:6650", "pulsar+ssl://b:6651")
    assert destination.urls_for("") == ("pulsar://b:6650", "pulsar+ssl://b:6651")
    # A client asking for a listener nobody advertises gets no URL (its lookups fail too).
    assert destination.urls_for("external") is None


def test_with_listeners_only_a_known_listener_name_gets_a_url():
    destination = Destination("pulsar://b:6650", "", {"internal": "pulsar://b:6650", "external": "pulsar://x:16650"})
    assert destination.urls_for("external") == ("pulsar://x:16650", "")
    assert destination.urls_for("internal") == ("pulsar://b:6650", "")
    # The connection never named a listener, or names one b lacks: the client looks up.
    assert destination.urls_for("") is None
    assert destination.urls_for("other") is None


def test_close_commands_name_the_broker_only_when_given():
    plain = commands.close_producer(7)
    assert not plain.close_producer.HasField("assignedBrokerServiceUrl")
    assert not plain.close_producer.HasField("assignedBrokerServiceUrlTls")
    named = commands.close_producer(7, assigned_url="pulsar://b:6650", assigned_url_tls="pulsar+ssl://b:6651")
    assert named.close_producer.assignedBrokerServiceUrl == "pulsar://b:6650"
    assert named.close_producer.assignedBrokerServiceUrlTls == "pulsar+ssl://b:6651"
    consumer = commands.close_consumer(3, assigned_url="pulsar://b:6650")
    assert consumer.close_consumer.consumer_id == 3
    assert consumer.close_consumer.assignedBrokerServiceUrl == "pulsar://b:6650"
    assert not consumer.close_consumer.HasField("assignedBrokerServiceUrlTls")
    assert not commands.close_consumer(3).close_consumer.HasField("assignedBrokerServiceUrl")


def test_a_plain_connection_gets_the_plain_url_in_the_tls_field_when_there_is_no_tls_one():
    plain_only = Destination("pulsar://b:6650")
    # Reached us in plain text: a client reading the TLS field is behind a TLS proxy.
    assert plain_only.urls_for_connection("", over_tls=False) == ("pulsar://b:6650", "pulsar://b:6650")
    # Over TLS: only a real TLS URL (none here).
    assert plain_only.urls_for_connection("", over_tls=True) == ("pulsar://b:6650", "")
    both = Destination("pulsar://b:6650", "pulsar+ssl://b:6651")
    assert both.urls_for_connection("", over_tls=False) == ("pulsar://b:6650", "pulsar+ssl://b:6651")
    assert both.urls_for_connection("", over_tls=True) == ("pulsar://b:6650", "pulsar+ssl://b:6651")
    # Listeners decide as before (a listener URL is plain; nothing named without one).
    listeners = Destination("pulsar://b:6650", "", {"internal": "pulsar://b:6650"})
    assert listeners.urls_for_connection("", over_tls=False) is None
    assert listeners.urls_for_connection("internal", over_tls=False) == ("pulsar://b:6650", "pulsar://b:6650")
