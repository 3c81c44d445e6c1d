"""Reading a process's Prometheus /metrics in tests: one scrape as {family: samples},
and the value of one exactly-labelled sample."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(base_url: str) -> dict[str, list]:
    """{family name: [Sample, ...]} of one /metrics scrape of ``base_url`` (http://host:port)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def value(families: dict[str, list], name: str, **labels: str) -> float | None:
    """The value of the one sample named ``name`` whose labels are exactly ``labels``
    (None when there is none)."""
    # A counter's or histogram's samples (name_total, name_count...) sit in the family
    # of the base name: look in every family whose name begins the sample's.
    found = [s.value for family, samples in families.items() if name.startswith(family)
             for s in samples if s.name == name and s.labels == labels]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None
