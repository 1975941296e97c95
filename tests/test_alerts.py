"""deploy/prometheus: the alert rules use the metrics a beat exports, and promtool passes them.

promtool comes with Debian's ``prometheus`` package (.ci/run installs it); where it
cannot be had the promtool tests are skipped with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from celery_leaderbeat.ops.metrics import Metrics

RULES_DIR = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULES = RULES_DIR / "leaderbeat-alerts.yml"
RULE_TESTS = RULES_DIR / "leaderbeat-alerts.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed "
                                    "(apt-get install prometheus); .ci/run installs it")


def exported_names() -> set[str]:
    """Every sample name one beat's /metrics can show (counters with _total, histograms...)."""
    suffixes = {"counter": ("_total",), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count")}
    return {family.name + suffix for family in Metrics().registry.collect()
            for suffix in suffixes[family.type]}


def test_every_metric_an_alert_uses_is_one_a_beat_exports():
    used = set(re.findall(r"\bleaderbeat_[a-z_]+\b", RULES.read_text()))
    used -= {"leaderbeat_lease_ttl", "leaderbeat_max_clock_skew", "leaderbeat_metrics_port"}
    assert used, "no metric found in the rules"
    assert used <= exported_names(), used - exported_names()


def test_every_alert_has_a_runbook_line_in_the_operations_docs():
    alerts = re.findall(r"- alert: (\w+)", RULES.read_text())
    page = (RULES_DIR.parents[1] / "docs" / "operations" / "metrics.md").read_text()
    section = page[page.index("\n## Alerts"):]
    assert len(alerts) == 7
    assert [a for a in alerts if f"`{a}`" not in section] == []


@needs_promtool
def test_promtool_checks_the_alert_rules():
    done = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, check=False,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 7 rules found" in done.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_alert_rules_pass():
    done = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS.name], cwd=RULES_DIR,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
