"""Weighted fair queuing across tenants, charged by tokens actually processed.

Each tenant has a virtual time that grows by ``tokens / weight`` whenever one of its requests
has tokens prefilled or generated. A free slot goes to the oldest waiting request of the
backlogged tenant with the smallest virtual time, so over a saturated run each tenant's share
of processed tokens follows its weight. A tenant that was idle restarts at the current system
virtual time (the smallest among active tenants), so idleness cannot be saved up and spent as
a burst. Idle tenants at or behind that time carry no information and are forgotten, which
keeps the state bounded by the number of active tenants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from tinyserve.engine.output.report import RULE_TENANT
from tinyserve.engine.request.sequence import Sequence, SequenceStatus


@dataclass
class _Tenant:
    weight: float
    vtime: float = 0.0
    waiting: deque[Sequence] = field(default_factory=deque)
    running: int = 0

    @property
    def active(self) -> bool:
        return bool(self.waiting) or self.running > 0


class WfqPolicy:
    name = "wfq"
    rule_kind = RULE_TENANT

    def __init__(self, weights: dict[str, float] | None = None, default_weight: float = 1.0):
        self._weights = dict(weights or {})
        self._default_weight = default_weight
        self._tenants: dict[str, _Tenant] = {}
        self._waiting = 0
        self.system_vtime = 0.0

    def _tenant(self, name: str) -> _Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            weight = self._weights.get(name, self._default_weight)
            tenant = self._tenants[name] = _Tenant(weight, self.system_vtime)
        elif not tenant.active:
            tenant.vtime = max(tenant.vtime, self.system_vtime)
        return tenant

    def add(self, seq: Sequence) -> None:
        self._tenant(seq.request.tenant).waiting.append(seq)
        self._waiting += 1

    def pop_next(self) -> Sequence | None:
        backlogged = [t for t in self._tenants.values() if t.waiting]
        if not backlogged:
            return None
        tenant = min(backlogged, key=lambda t: t.vtime)
        seq = tenant.waiting.popleft()
        tenant.running += 1
        self._waiting -= 1
        return seq

    def rule(self, seq: Sequence) -> str:
        """The tenant (the backlogged one with the smallest virtual time) and that time."""
        tenant = self._tenants[seq.request.tenant]
        return f"tenant={seq.request.tenant} vtime={tenant.vtime:.1f} weight={tenant.weight:g}"

    def charge(self, seq: Sequence, tokens: int) -> None:
        tenant = self._tenants[seq.request.tenant]
        tenant.vtime += tokens / tenant.weight
        self._advance_system_vtime()

    def remove(self, seq: Sequence) -> None:
        tenant = self._tenants[seq.request.tenant]
        if seq.status is SequenceStatus.WAITING:
            tenant.waiting.remove(seq)
            self._waiting -= 1
        else:
            tenant.running -= 1
        self._advance_system_vtime()

    def _advance_system_vtime(self) -> None:
        active = [t.vtime for t in self._tenants.values() if t.active]
        if active:
            self.system_vtime = max(self.system_vtime, min(active))
        elif self._tenants:
            # Nobody is active: past service no longer matters; everyone restarts level.
            self.system_vtime = max(t.vtime for t in self._tenants.values())
        for name in [n for n, t in self._tenants.items() if not t.active]:
            if self._tenants[name].vtime <= self.system_vtime:
                del self._tenants[name]

    @property
    def tenants(self) -> int:
        """Tenants with state kept (active ones, plus idle ones still ahead in virtual time)."""
        return len(self._tenants)

    def __len__(self) -> int:
        return self._waiting

    def __iter__(self) -> Iterator[Sequence]:
        return (seq for t in self._tenants.values() for seq in t.waiting)
