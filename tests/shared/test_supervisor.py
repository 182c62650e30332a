"""The launcher's restart policy: back-off doubling to a cap, and giving up on a crash loop."""

from __future__ import annotations

from tinyserve.supervisor import RestartPolicy


def test_back_off_doubles_up_to_the_cap() -> None:
    policy = RestartPolicy(limit=100, interval_s=1000.0, first_delay_s=0.5, max_delay_s=10.0)
    delays = [policy.on_death(now=float(t)) for t in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_more_deaths_than_the_limit_within_the_interval_give_up() -> None:
    policy = RestartPolicy(limit=3, interval_s=60.0)
    assert [policy.on_death(now) for now in (0.0, 1.0, 2.0)] == [0.5, 1.0, 2.0]
    assert policy.on_death(59.0) is None
    assert policy.recent_deaths == 4


def test_deaths_older_than_the_interval_are_forgotten() -> None:
    policy = RestartPolicy(limit=2, interval_s=10.0)
    assert policy.on_death(0.0) == 0.5
    assert policy.on_death(1.0) == 1.0
    # A process that then ran well for the whole interval starts again from the first delay,
    # and its old deaths no longer count toward the limit.
    assert policy.on_death(11.5) == 0.5
    assert policy.recent_deaths == 1
    assert policy.on_death(12.0) == 1.0
    assert policy.on_death(13.0) is None


def test_limit_zero_never_restarts() -> None:
    assert RestartPolicy(limit=0, interval_s=120.0).on_death(5.0) is None
