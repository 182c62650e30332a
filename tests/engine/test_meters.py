"""engine/meters.py: the scheduler-decision label stays bounded whatever tenants clients name."""

from __future__ import annotations

from tinyserve.engine.meters import rule_label


def test_rule_label_keeps_configured_tenants_and_bounded_rules() -> None:
    tenants = frozenset({"a", "b"})
    assert rule_label("tenant=a", tenants) == "tenant=a"
    assert rule_label("tenant=someone-made-this-up-42", tenants) == "tenant=other"
    assert rule_label("priority=3", tenants) == "priority=3"
    assert rule_label("arrival", tenants) == "arrival"
    assert rule_label("", tenants) == "next"
