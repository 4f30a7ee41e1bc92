"""The automatic hooks' cost per training step against hand-written contexts (for hotpath.py).

Three variants of one real training loop (a ``torch.nn.Linear`` over a ``DataLoader`` of an
in-memory dataset, SGD, one process) run interleaved, round after round:

* untimed: the loop alone;
* hand-written: ``timer.iter(loader)``, ``timer.step()`` and the four timed stages around
  forward, backward and the optimizer step (the integration a user writes);
* automatic: the same loop as the untimed one, timed by ``auto.AutoDriver`` (optimizer step
  hooks, the model's timed ``forward``, the patched backward and DataLoader ``next``), as
  ``stagefrontier run`` installs it.

A variant's cost is its loop time less the untimed loop's in the same round, per step; the
ratio of the automatic to the hand-written cost is taken per round (the median over rounds, its
95% interval and the quartiles are reported) and between the variants' medians. On a busy
machine the two can disagree: the verdict is given only when they and the 95% interval of the
per-round median lie on the same side of the target, and is "unresolved at this load"
otherwise. ``count_instructions`` counts the same loops' instructions under callgrind
(``callgrind_counts``), a ratio the load does not
move. Both timers hand their windows to a collector that drops them.
"""

from __future__ import annotations

import gc
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Clock = Callable[[], int]
_clock: Clock = time.thread_time_ns
METHOD = (
    "Method: {rounds} interleaved rounds (order reversed every other round) of four loops of "
    "{steps} training steps each, the first two untimed in every loop (the automatic hooks "
    "learn the loop's shape in the first and build their timer in the second, once a run) (a "
    "`Linear(4, 1)` over a `DataLoader` of an in-memory "
    "dataset, batch 1, MSE loss, SGD; one process, the garbage collector off), timed with "
    "`time.thread_time_ns`: untimed; untimed with no-op hooks where the automatic ones go; "
    "hand-written (`timer.iter`, `timer.step()` and the "
    "forward, backward and optimizer stages); automatic (the same loop as the untimed one, "
    "under `auto.AutoDriver`, as `stagefrontier run` installs it). A variant's cost is its "
    "loop less the untimed loop of the same round, per step; the ratio of the automatic to the "
    "hand-written cost is taken per round (median over rounds, with its distribution-free 95% "
    "interval)."
)
SETUP_STEPS = 2
"""Steps of every loop run before its clock starts: the automatic hooks watch the first step
untimed and build their timer at the second, once a run (the hand-written timer is built before
its loop)."""
HOOKS_TARGET = 1.5
"""The automatic hooks may cost at most this many times what hand-written contexts cost."""


class _Drop:
    """A collector that drops every window (the analysis is not measured here)."""

    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.sinks: list[Any] = []

    def submit(self, window: object) -> bool:
        return True

    def close(self) -> None:
        return None


def _workload(steps: int) -> tuple[Any, Any, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = steps + SETUP_STEPS
    data = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    return model, optimizer, DataLoader(data, batch_size=1)


def _train(model: Any, optimizer: Any, loader: Any, clock: Clock) -> int:
    """The loop as a script writes it, with no StageFrontier in it; what ``clock`` counts over
    its steps after the first ``SETUP_STEPS``."""
    import torch.nn.functional as F

    start = 0
    for i, (x, y) in enumerate(loader):
        if i == SETUP_STEPS:
            start = clock()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return clock() - start


def _untimed(steps: int, clock: Clock) -> int:
    return _train(*_workload(steps), clock)


def _hand_written(steps: int, clock: Clock) -> int:
    import torch.nn.functional as F

    from stagefrontier import StageTimer, TimerConfig

    model, optimizer, loader = _workload(steps)
    timer = StageTimer(config=TimerConfig(window=steps + SETUP_STEPS + 1), collector=_Drop())
    step, stage = timer.step, timer.stage
    start = 0
    for i, (x, y) in enumerate(timer.iter(loader)):
        if i == SETUP_STEPS:
            start = clock()
        with step():
            with stage("model.fwd_loss_cpu_wall"):
                loss = F.mse_loss(model(x), y)
            with stage("model.backward_cpu_wall"):
                loss.backward()
            with stage("optim.step_cpu_wall"):
                optimizer.step()
                optimizer.zero_grad()
    elapsed = clock() - start
    timer.close()
    return elapsed


def _automatic(steps: int, clock: Clock) -> int:
    from stagefrontier.auto.driver import AutoDriver
    from stagefrontier.integrations._timer import TimerArguments

    model, optimizer, loader = _workload(steps)
    driver = AutoDriver(
        TimerArguments(
            "the benchmark's", [], None, {"window": steps + SETUP_STEPS + 1, "collector": _Drop()}
        )
    )
    driver.install()
    try:
        return _train(model, optimizer, loader, clock)
    finally:
        driver.stop()


def _untimed_forward(inner: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for the model's forward that only calls it (the dispatch of the timed one)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    return forward


def _torch_hooks(steps: int, clock: Clock) -> int:
    """The untimed loop with no-op hooks where the automatic ones go (a ``forward`` on the model
    that only calls the model's own, the global optimizer step hooks): what their dispatch
    costs alone."""
    from torch.optim import optimizer as optim

    from stagefrontier.auto.model import ForwardPatch

    model, optimizer, loader = _workload(steps)
    handles = [
        ForwardPatch(model, _untimed_forward),
        optim.register_optimizer_step_pre_hook(lambda opt, args, kwargs: None),
        optim.register_optimizer_step_post_hook(lambda opt, args, kwargs: None),
    ]
    try:
        return _train(model, optimizer, loader, clock)
    finally:
        for handle in handles:
            handle.remove()


VARIANTS: dict[str, Callable[[int, Clock], int]] = {
    "untimed": _untimed,
    "torch_hooks": _torch_hooks,
    "hand": _hand_written,
    "auto": _automatic,
}


def measure(rounds: int, steps: int) -> list[dict[str, int]]:
    """Raw thread-CPU nanoseconds of each variant's loop of ``steps`` steps, per round (the
    order reversed every other round; the garbage collector off while a loop runs)."""
    out = []
    for rnd in range(rounds):
        names = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
        row = {}
        for name in names:
            gc.collect()
            gc.disable()
            try:
                row[name] = VARIANTS[name](steps, _clock)
            finally:
                gc.enable()
        out.append(row)
    return out


def count_child(rounds: int, steps: int) -> None:
    """The process ``count_instructions`` runs under callgrind: every variant once a round, in
    the same order, each loop's first timed step and its end marked."""
    import torch

    from callgrind_counts import Marks

    torch.set_num_threads(1)  # no intra-op pool threads: the count is the training thread's
    marks = Marks.load()
    marks.start()
    for _ in range(rounds):
        for run in VARIANTS.values():
            gc.collect()
            gc.disable()
            try:
                run(steps, marks.mark)
            finally:
                gc.enable()


def count_instructions(rounds: int, steps: int) -> list[dict[str, int]]:
    """Instructions of each variant's loop of ``steps`` steps, per round (``count_child`` under
    callgrind; a round's counts are alike but for the first, which warms the interpreter up)."""
    import callgrind_counts

    counts = callgrind_counts.count(
        [str(Path(__file__).resolve()), "--count-child", str(rounds), str(steps)]
    )
    loops = counts[1::2]  # each loop's own stretch: the one that ends at its last mark
    if len(loops) != rounds * len(VARIANTS):
        raise RuntimeError(f"{len(loops)} loops counted, {rounds * len(VARIANTS)} expected")
    width = len(VARIANTS)
    rows = [loops[r * width : r * width + width] for r in range(rounds)]
    return [dict(zip(VARIANTS, row, strict=True)) for row in rows]


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """The distribution-free ``confidence`` interval of the median of ``values``: the order
    statistics ``k`` and ``n - k + 1`` (1-based) for the largest ``k`` with at most
    ``(1 - confidence) / 2`` of the binomial(n, 1/2) mass below ``k``. Too few values for such
    a ``k`` (5 or fewer at 95%) bound nothing: minus and plus infinity. It takes the rounds as
    independent draws; rounds under a load that drifts are not quite, so it is a little too
    narrow there."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k, mass = (1 - confidence) / 2, 0, 0.0
    while k < n and mass + math.comb(n, k) / 2**n <= tail:
        mass += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return -math.inf, math.inf
    return ordered[k - 1], ordered[n - k]


def verdict(low: float, per_round: float, high: float, of_medians: float) -> str:
    """MET or MISSED only when the median of the per-round ratios, its whole 95% interval
    (``low`` to ``high``, ``median_interval``) and the ratio of the medians lie on one side of
    the target; on a busy machine they may not, and the figure then decides nothing."""
    if max(per_round, high, of_medians) <= HOOKS_TARGET:
        return "MET"
    if min(per_round, low, of_medians) > HOOKS_TARGET:
        return "MISSED"
    return "unresolved at this load"


def per_step(rows: Sequence[dict[str, int]], name: str, steps: int) -> list[float]:
    """``name``'s loop less the untimed loop of the same round, per step, round by round."""
    return [(r[name] - r["untimed"]) / steps for r in rows]


def instruction_lines(counted: Sequence[dict[str, int]] | str | None, steps: int) -> list[str]:
    """The verdict on instruction counts (``count_instructions``; the first round, which warms
    the interpreter up, left out), or why there is none."""
    if counted is None:
        return [
            "- instructions: not counted in this run (`--instructions` counts them under "
            "callgrind, a figure the machine's load does not move)."
        ]
    if isinstance(counted, str):
        return [f"- instructions: not counted ({counted})."]
    warm = counted[1:] or counted
    hand, auto = per_step(warm, "hand", steps), per_step(warm, "auto", steps)
    ratio = statistics.median(auto) / statistics.median(hand)
    ratios = [a / h for a, h in zip(auto, hand, strict=True)]
    met = "MET" if ratio <= HOOKS_TARGET else "MISSED"
    return [
        f"- instructions (callgrind, {len(warm)} rounds of {steps} steps after one of warm-up; "
        "the machine's load does not move them): the automatic hooks execute "
        f"{statistics.median(auto):.0f} instructions a step over the untimed loop, hand-written "
        f"contexts {statistics.median(hand):.0f}: {ratio:.2f}x (per round {min(ratios):.2f} - "
        f"{max(ratios):.2f}), target <= {HOOKS_TARGET:g}x: {met}."
    ]


def table(measured: Sequence[dict[str, int]], steps: int, instructions: Sequence[str]) -> list[str]:
    """The markdown table and its verdicts: on thread CPU time, then ``instructions`` (the lines
    of ``instruction_lines``)."""
    hand, auto = per_step(measured, "hand", steps), per_step(measured, "auto", steps)
    dispatch = per_step(measured, "torch_hooks", steps)
    ratios = [a / h for a, h in zip(auto, hand, strict=True) if h > 0]
    base = statistics.median(r["untimed"] / steps for r in measured)
    if not ratios or statistics.median(hand) <= 0:
        return ["- automatic hooks: not measured (the hand-written cost was lost in the noise)."]
    q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
    low, high = median_interval(ratios)
    of_medians = statistics.median(auto) / statistics.median(hand)
    said = verdict(low, q2, high, of_medians)
    return [
        "| variant | ns per step over the untimed loop | x hand-written: median of the "
        "per-round ratios (its 95% interval) | x hand-written: ratio of the medians | target |",
        "|---|---:|---:|---:|---|",
        f"| untimed loop ({base:.0f} ns per step, subtracted) | 0 | - | - | - |",
        "| (the dispatch of no-op hooks where the automatic ones go: the model's timed forward, "
        f"the global optimizer step hooks) | {statistics.median(dispatch):.0f} | - | - | - |",
        f"| hand-written: `timer.iter`, `timer.step`, 3 stages | {statistics.median(hand):.0f}"
        " | 1.00 | 1.00 | - |",
        f"| automatic hooks (`stagefrontier run`), {100 * statistics.median(auto) / base:.0f}% "
        f"of the untimed step | {statistics.median(auto):.0f} | "
        f"{q2:.2f} ({low:.2f} - {high:.2f}) | {of_medians:.2f} | <= {HOOKS_TARGET:g}x |",
        "",
        f"- automatic hooks, thread CPU time: {q2:.2f}x the hand-written contexts' cost per step "
        f"by the median of the per-round ratios (its 95% interval {low:.2f} - {high:.2f}; one "
        f"round's ratio scatters more, quartiles {q1:.2f} - {q3:.2f}; {len(ratios)} rounds of "
        f"{steps} steps), {of_medians:.2f}x by the ratio of the medians, target <= "
        f"{HOOKS_TARGET:g}x: {said}"
        + (
            "."
            if said != "unresolved at this load"
            else " (the two ratios disagree, or the median's interval straddles the target)."
        ),
        *instructions,
        *(
            []
            if said == "MET"
            else [
                WHY.format(
                    dispatch=statistics.median(dispatch),
                    base_ms=base / 1e6,
                    share_100ms=statistics.median(auto) / 1e8 * 100,
                )
            ]
        ),
    ]


WHY = (
    "- Why: the dispatch of the hooks alone costs {dispatch:.0f} ns a step (the row above: the "
    "model's forward passes through its timed stand-in, and the optimizer's step wrapper calls "
    "its global hooks). Beyond it, a step under the automatic hooks runs five Python functions "
    "of theirs (the DataLoader `next()` wrapper, the model's timed forward, the backward "
    "wrapper, the optimizer's step pre- and post-hook) where hand-written contexts run one "
    "(`timer.iter`'s generator); the timed forward takes its arguments as `*args, **kwargs` "
    "(any model's: a dict and a tuple each call), and the fetch and the forward each check the "
    "grad mode. The timer's contexts entered and left are the same in both. The loop here is a toy "
    "step of about {base_ms:.2f} ms, which makes the cost a large share of it; on a step of "
    "100 ms it is about {share_100ms:.3f}%."
)


def report(rounds: int, steps: int, count: tuple[int, int] | None = None) -> list[str]:
    """The measurement and its table, or one line saying why it did not run; ``count``: also
    count instructions, in that many rounds of that many steps."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return ["- automatic hooks: not measured (torch is not installed)."]
    measured = measure(rounds, steps)
    if count is None:
        return table(measured, steps, instruction_lines(None, steps))
    import callgrind_counts

    count_rounds, count_steps = count
    counted: list[dict[str, int]] | str | None = callgrind_counts.missing()
    if counted is None:
        try:
            counted = count_instructions(count_rounds, count_steps)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            counted = str(exc)
    return table(measured, steps, instruction_lines(counted, count_steps))


if __name__ == "__main__":  # the child of ``count_instructions``: ``--count-child ROUNDS STEPS``
    if sys.argv[1:2] == ["--count-child"]:
        count_child(int(sys.argv[2]), int(sys.argv[3]))
