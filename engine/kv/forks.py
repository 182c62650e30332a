"""Choices of one prompt that share its prefill (``n`` > 1, ``Submit.fork_of``).

The frontend submits the first choice (the leader) and then the others (followers) naming it.
A follower accepted while its leader is in flight waits, once it holds a slot, for the
leader's prefill instead of doing its own. When the leader's last prompt chunk is decoded,
``fork`` copies the prompt's KV into each waiting follower's slot and every one of them samples
its first token from the leader's logits row with its own sampler.

A follower granted a slot after its leader's prefill ended copies all but the prompt's last
token and decodes that one itself (it needs its own logits row). One granted while its leader
has no slot yet (or after the leader ended) goes alone: waiting on a leader that itself waits
for a slot could hold every slot idle.
"""

from __future__ import annotations

from collections.abc import Mapping

from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.runtime.runtime import LlamaRuntime


def follow(seq: Sequence, by_id: Mapping[str, Sequence]) -> None:
    """Make ``seq`` a follower of the request it names, if that one may lead: in flight,
    the same prompt, itself no follower."""
    name = seq.request.fork_of
    leader = by_id.get(name) if name else None
    if leader is None or leader.request.prompt_ids != seq.request.prompt_ids:
        return
    if leader.status in (SequenceStatus.NEW, SequenceStatus.FINISHED) or leader.leader is not None:
        return
    seq.leader = leader
    leader.followers.append(seq)


def on_grant(seq: Sequence, runtime: LlamaRuntime) -> None:
    """``seq`` (a follower) got its slot: wait for the leader's prefill, copy the prompt's KV
    now, or go alone (see the module's docstring)."""
    leader = seq.leader
    if leader is None:
        return
    if leader.status is SequenceStatus.PREFILL:
        return  # fork() takes it when the leader's prompt is in
    if leader.status is SequenceStatus.DECODE:
        shared = seq.prompt_len - 1
        runtime.share(leader.slot, seq.slot, shared)
        seq.n_past = shared
        seq.timeline.forked(leader.request_id, shared)
    unfollow(seq)


def waiting(leader: Sequence) -> list[Sequence]:
    """The followers of ``leader`` that hold a slot and wait for its prefill."""
    return [f for f in leader.followers if f.status is SequenceStatus.PREFILL]


def fork(leader: Sequence, follower: Sequence, runtime: LlamaRuntime) -> None:
    """The leader's prompt is in: copy it to ``follower``, which then decodes (its first
    token sampled from the leader's logits row)."""
    runtime.share(leader.slot, follower.slot, leader.prompt_len)
    follower.n_past = leader.prompt_len
    follower.timeline.forked(leader.request_id, leader.prompt_len)
    unfollow(follower)


def unfollow(seq: Sequence) -> None:
    """``seq`` no longer waits on its leader (forked, or going alone)."""
    if seq.leader is not None:
        seq.leader.followers.remove(seq)
        seq.leader = None


def release(leader: Sequence) -> None:
    """``leader`` ends: its remaining followers prefill on their own."""
    for follower in list(leader.followers):
        unfollow(follower)
