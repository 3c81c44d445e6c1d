"""The alert rules (ops/prometheus/alerts.yml) pass `promtool check rules` and their
unit tests (`promtool test rules ops/prometheus/alerts_test.yml`: series that fire and
series that do not); every rule has a `for:`, a summary, a runbook entry that exists in
docs/alerts.md, and at least one firing and one non-firing case in the tests.
promtool comes from Debian's `prometheus` package, which `make setup` installs: without
it this test fails, saying so."""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = os.path.join(ROOT, "ops", "prometheus", "alerts.yml")
RULE_TESTS = os.path.join(ROOT, "ops", "prometheus", "alerts_test.yml")
RUNBOOK = os.path.join(ROOT, "docs", "alerts.md")


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run `make setup` (it installs Debian's prometheus package, which has it)"
    return path


def _alerts() -> list[dict]:
    with open(RULES, encoding="utf-8") as handle:
        document = yaml.safe_load(handle)
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules_and_runs_their_tests():
    promtool = _promtool()
    checked = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([promtool, "test", "rules", RULE_TESTS], capture_output=True, text=True, timeout=120,
                            cwd=os.path.dirname(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout + tested.stderr


def test_every_rule_has_a_duration_summary_runbook_and_both_kinds_of_case():
    with open(RULE_TESTS, encoding="utf-8") as handle:
        cases = [case for test in yaml.safe_load(handle)["tests"] for case in test["alert_rule_test"]]
    with open(RUNBOOK, encoding="utf-8") as handle:
        anchors = {line.lstrip("#").strip().lower() for line in handle if line.startswith("## ")}
    alerts = _alerts()
    assert len(alerts) >= 8
    for rule in alerts:
        name = rule["alert"]
        assert rule.get("for"), f"{name} has no for: duration"
        assert "{{ $labels." in rule["annotations"]["summary"] or "$value" in rule["annotations"]["summary"], name
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/alerts.md has no section for {name}"
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name} has no firing case"
        assert any(not case["exp_alerts"] for case in mine), f"{name} has no non-firing case"
