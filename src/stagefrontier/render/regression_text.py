"""A flagged regression (``analysis.regression``) in the window line's words: how much slower,
against which baseline windows, and where: a stage and its ranks, the rank the others wait for
in a collective, or the whole job with what rank 0's host signals say."""

from __future__ import annotations

from typing import Any

from ..analysis.collective_names import DEFAULT_FAMILY, collective_name, ddp_family
from ..analysis.regression import STEAL_SHARE, WHOLE_JOB

RANKS_NAMED = 3
"""The most ranks a regression's line names before it ends in ``,...``."""


def regression_text(regression: dict[str, Any]) -> str:
    """A few words for the window line: ``+38 ms/step vs windows 4-8: data.next_wait +35 ms,
    all ranks``, ``+92 ms/step vs windows 0-1: rank 1 late into model.backward_cpu_wall's last
    bucket`` when the timed collectives name the late rank (``late``), or for a slowdown of
    the whole job ``+41 ms/step vs windows 4-8: the whole job
    slowed 38% evenly over ranks and stages: the cause is outside the training code`` and what
    rank 0's host signals say."""
    first, last = regression["baseline_windows"]
    top = regression["top_stage"]
    delta = regression["delta_advance_ms_per_step"][top]
    ranks = regression["ranks"]
    more = ",..." if len(ranks) > RANKS_NAMED else ""
    shown = ",".join(str(r) for r in ranks[:RANKS_NAMED]) + more
    named = ("rank " if len(ranks) == 1 else "ranks ") + shown
    span = f"window {first}" if first == last else f"windows {first}-{last}"
    head = f"{regression['delta_exposed_ms_per_step']:+.0f} ms/step vs {span}: "
    if regression.get("kind") == WHOLE_JOB and regression.get("within_wander"):
        return (
            head + f"the whole job slowed {regression['slowdown']:.0%}, no more than this run's "
            "windows move with the machine's load: the cause is outside the training code"
            + host_text(regression.get("host"))
        )
    if regression.get("kind") == WHOLE_JOB:
        where = "ranks and stages" if regression["all_ranks"] else f"its stages (most on {named})"
        return (
            head + f"the whole job slowed {regression['slowdown']:.0%} evenly over {where}: "
            "the cause is outside the training code" + host_text(regression.get("host"))
        )
    late = regression.get("late")
    if late:  # the ranks' timed collectives name the rank the others wait for
        family = str(late.get("family", DEFAULT_FAMILY))  # absent from older records
        which = "last bucket" if late["last_bucket"] else f"bucket {late['bucket']}"
        if not ddp_family(family):
            which = collective_name(family, late["bucket"])
        return head + f"rank {late['rank']} late into {late['stage']}'s {which}"
    who = "all ranks" if regression["all_ranks"] else named
    return head + f"{top} {delta:+.0f} ms, {who}"


def host_text(host: dict[str, Any] | None) -> str:
    """What rank 0's host signals (``collect.host_signals``) say of a slowdown, in a few words:
    the ones that changed, else the ones read."""
    if not host:
        return ""
    now, before = host.get("now", {}), host.get("before", {})
    said: list[str] = []
    load, was = now.get("load_average"), before.get("load_average")
    if load is not None and was is not None and load >= 1.5 * was and load - was >= 1:
        said.append(f"other work competes for the CPUs (load average {load:.1f}, was {was:.1f})")
    if now.get("steal_share", 0.0) >= STEAL_SHARE:
        said.append(f"the hypervisor took {now['steal_share']:.0%} of the CPU time (steal)")
    if now.get("throttled_periods", 0) > 0:
        said.append(
            f"the cgroup's CPU quota throttled it {now['throttled_periods']} times "
            f"({now.get('throttled_ms', 0.0):.0f} ms)"
        )
    cpu, cpu_was = now.get("cpu_per_wall"), before.get("cpu_per_wall")
    if cpu is not None and cpu_was is not None and cpu < 0.8 * cpu_was:
        said.append(f"rank 0's process got {cpu:.2f} s of CPU per second, was {cpu_was:.2f}")
    if said:
        return " (" + "; ".join(said) + ")"
    read = [f"load average {load:.1f}" if load is not None else ""]
    read.append(f"CPU steal {now['steal_share']:.0%}" if "steal_share" in now else "")
    read.append("no CPU throttling" if now.get("throttled_periods") == 0 else "")
    shown = ", ".join(x for x in read if x)
    return f" (no host signal says which{': ' + shown if shown else ''})"
