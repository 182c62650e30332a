"""The Grafana dashboard, the Prometheus config and its alerting rules stay in sync with
tinyserve.metrics; promtool checks the rules and runs their unit tests
(``tinyserve-rules.test.yml``: synthetic series, and the alerts that must or must not fire)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tinyserve.metrics import SPECS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tinyserve-dashboard.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULES = ROOT / "deploy" / "prometheus" / "tinyserve-rules.yml"
HERE = Path(__file__).parent
RULES_TEST = "tinyserve-rules.test.yml"  # in this folder (its rule_files path is relative)
OBSERVABILITY = ROOT / "docs" / "observability.md"
# Metrics deliberately left off the dashboard, with why. Empty today: every metric has a panel.
NOT_SHOWN: dict[str, str] = {}
NAME = re.compile(r"\btinyserve_[a-z0-9_]+")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def queries(node: Any) -> list[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        own = [v for k, v in node.items() if k in ("expr", "definition") and isinstance(v, str)]
        return own + [q for value in node.values() for q in queries(value)]
    if isinstance(node, list):
        return [q for item in node for q in queries(item)]
    return []


def family(series: str) -> str:
    """The metric a queried series belongs to (a histogram's _bucket/_sum/_count included)."""
    histograms = {spec.name for spec in SPECS if spec.kind == "histogram"}
    for suffix in HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if base != series and base in histograms:
            return base
    return series


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_dashboard_queries_only_defined_metrics() -> None:
    defined = {spec.name for spec in SPECS}
    queried = {family(name) for q in queries(dashboard()) for name in NAME.findall(q)}
    assert queried, "no tinyserve_ metric queried at all"
    assert queried <= defined, f"queried but not defined: {sorted(queried - defined)}"


def test_every_metric_is_on_the_dashboard_or_left_off_on_purpose() -> None:
    queried = {family(name) for q in queries(dashboard()) for name in NAME.findall(q)}
    defined = {spec.name for spec in SPECS}
    assert set(NOT_SHOWN) <= defined
    assert not set(NOT_SHOWN) & queried, "listed as not shown, but shown"
    missing = defined - queried - set(NOT_SHOWN)
    assert not missing, f"defined but on no panel: {sorted(missing)}"


def test_panels_are_well_formed() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"] for t in panel["targets"]), panel["title"]


def test_scrape_config_scrapes_metrics_path() -> None:
    text = SCRAPE_CONFIG.read_text()
    assert "metrics_path: /metrics" in text
    assert "job_name: tinyserve" in text


def test_every_metric_is_documented() -> None:
    text = OBSERVABILITY.read_text()
    for spec in SPECS:
        assert f"`{spec.name}`" in text, spec.name
    documented = {family(name) for name in NAME.findall(text)}
    assert documented <= {spec.name for spec in SPECS}, "docs name a metric that is not defined"


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_alerting_rules_query_defined_metrics_and_are_loaded_by_the_scrape_config() -> None:
    defined = {spec.name for spec in SPECS}
    labels = {label for spec in SPECS for label in spec.labels}
    assert len(rules()) >= 5
    for rule in rules():
        expr = rule["expr"]
        queried = {family(name) for name in NAME.findall(expr)}
        assert queried <= defined, (rule["alert"], sorted(queried - defined))
        # A label matcher names a label the metric has (instance and job: Prometheus's).
        matched = set(re.findall(r"(\w+)=~?\"", expr)) - {"instance", "job"}
        assert matched <= labels, (rule["alert"], matched - labels)
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert config["rule_files"] == [RULES.name]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
@pytest.mark.parametrize("check", [["check", "rules", str(RULES)], ["test", "rules", RULES_TEST]])
def test_promtool_accepts_the_rules_and_they_fire_when_they_should(check: list[str]) -> None:
    done = subprocess.run(["promtool", *check], capture_output=True, text=True, cwd=HERE)
    assert done.returncode == 0, done.stdout + done.stderr
