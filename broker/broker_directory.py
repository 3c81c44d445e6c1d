"""Where brokers are (for ``BrokerService``): this broker's URLs from its config, the
others' from their load reports in etcd (bundles/load.py), and the destination a
hand-over sends clients to (broker/redirect.py)."""

from __future__ import annotations

from broker.config import BrokerConfig
from broker.redirect import Destination
from bundles.records import LoadReport
from metadata import keys
from metadata.prefix_cache import PrefixCache


class BrokerDirectory:
    def __init__(self, config: BrokerConfig, broker_reports: PrefixCache | None) -> None:
        """``broker_reports``: the watch of every broker's load report (None without the
        bundles layer: only this broker is known)."""
        self.config = config
        self.broker_id = config.effective_broker_id
        self.broker_reports = broker_reports

    def broker_urls(self, broker_id: str) -> tuple[str, str] | None:
        """(service URL, web service URL) of a live broker, from its load report."""
        if broker_id == self.broker_id:
            return self.config.service_url, self.config.web_service_url
        if self.broker_reports is None:
            return None
        record = self.broker_reports.get(keys.broker(broker_id))
        if record is None:
            return None
        report = LoadReport.decode(record.value)
        return report.service_url, report.web_service_url

    def broker_listeners(self, broker_id: str) -> dict[str, str] | None:
        """A live broker's advertised listeners (name -> pulsar:// URL), from its load
        report; None if it is not known."""
        if broker_id == self.broker_id:
            return self.config.listeners
        if self.broker_reports is None:
            return None
        record = self.broker_reports.get(keys.broker(broker_id))
        return LoadReport.decode(record.value).listeners if record is not None else None

    def broker_tls_urls(self, broker_id: str) -> tuple[str, str]:
        """(pulsar+ssl:// URL, https:// URL) of a live broker, ("", "") without TLS."""
        if broker_id == self.broker_id:
            return self.config.service_url_tls, self.config.web_service_url_tls
        record = self.broker_reports.get(keys.broker(broker_id)) if self.broker_reports is not None else None
        if record is None:
            return "", ""
        report = LoadReport.decode(record.value)
        return report.service_url_tls, report.web_service_url_tls

    def destination(self, broker_id: str) -> Destination | None:
        """The URLs a hand-over to ``broker_id`` sends clients to; None if the broker is
        not known (no load report): its clients look the topics up instead."""
        if broker_id == self.broker_id:
            return None
        urls = self.broker_urls(broker_id)
        if urls is None:
            return None
        return Destination(urls[0], self.broker_tls_urls(broker_id)[0], dict(self.broker_listeners(broker_id) or {}))
