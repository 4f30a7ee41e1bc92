"""How a long run's report says what it summarized: the sentence naming which windows are shown
one by one and how the others are counted, and the text table of the buckets
(``formats.run_digest``). ``render.text`` prints both; ``render.run_html`` shows the sentence
and draws the buckets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..formats.records import window_name
from ..formats.run_digest import SHOWN_ALL, Bucket, MethodShares, Tallies

if TYPE_CHECKING:
    from ..formats.run_folder import RunWindows


def summary_sentence(run: RunWindows) -> str:
    """Which windows the report shows one by one, and how it counts the others."""
    over = (
        f"; {run.flagged_over} more flagged window(s) are counted in the buckets only"
        if run.flagged_over
        else ""
    )
    per = run.count / max(len(run.buckets), 1)
    why = "too many to show one by one" if run.count > SHOWN_ALL else "some of them cut down"
    return (
        f"This run holds {run.count} windows, {why}: "
        f"{len(run.windows)} are shown in full (the first, the last, the last full window, the "
        f"one StageFrontier cost most, and {run.flagged} flagged: a regression or the profiler "
        f"router at work{over}), and every window is summarized in {len(run.buckets)} buckets "
        f"of about {per:.0f} consecutive windows: the exposed ms/step's min, median and max, "
        "each stage's mean share, the top stage most often, and the ranks that led. The labels "
        "and routing sets count every window." + _cut_sentence(run)
    )


def _cut_sentence(run: RunWindows) -> str:
    """What the disk budget cut, when it cut records: those windows are in the buckets only."""
    cut = run.tallies.cut
    if not cut:
        return ""
    return (
        f" The disk budget cut the records of {cut} old healthy window(s) down to their summary "
        "(steps, ms/step, shares, leaders, labels): they count in the buckets and tallies, "
        "and none of them can be shown in full (see compacted.jsonl)."
    )


def bucket_span(bucket: Bucket) -> str:
    """``0-1666`` (the bucket's first and last window)."""
    first, last = window_name(bucket.first), window_name(bucket.last)
    return first if first == last else f"{first}-{last}"


def bucket_steps(bucket: Bucket) -> str:
    return f"{bucket.first['first_step']}-{bucket.last['last_step']}"


def bucket_top(bucket: Bucket) -> str:
    """``model.forward 46%``: the top stage most often, with its mean share; ``-`` for none."""
    if bucket.top is None:
        return "-"
    share = bucket.shares.get(bucket.top)
    return bucket.top if share is None else f"{bucket.top} {share:.0%}"


def bucket_leaders(bucket: Bucket, most: int = 3) -> str:
    """``rank 3 (data.next_wait, 120 windows)``, the ranks that led most windows first."""
    ranked = sorted(bucket.leaders.items(), key=lambda item: (-item[1][1], item[0]))
    return ", ".join(
        f"rank {rank} ({stage}, {count} windows)" for rank, (stage, count) in ranked[:most]
    )


def summary_text(run: RunWindows) -> list[str]:
    """The sentence, then one line per bucket."""
    lines = [summary_sentence(run), "", "Summary of every window, by bucket:"]
    lines.append(
        "  windows        steps              windows  ms/step min/median/max  "
        "top stage (mean share)  leading ranks"
    )
    for b in run.buckets:
        ms = "/".join(f"{value:.1f}" for value in b.ms)
        lines.append(
            f"  {bucket_span(b):<13}  {bucket_steps(b):<17}  {b.count:>7}  {ms:<22}  "
            f"{bucket_top(b):<22}  {bucket_leaders(b) or '-'}"
        )
    return lines


def sample_note(methods: MethodShares) -> str:
    """`` (over 2000 of 100000 windows' packets, evenly spaced)`` when the comparison read a
    sample, else empty."""
    if methods.compared == methods.packets:
        return ""
    return f" (over {methods.compared} of {methods.packets} windows' packets, evenly spaced)"


def step_span(tallies: Tallies) -> str:
    """``0-799``, or each restart attempt's steps after a restart: ``0-799 (attempt 0),
    0-799 (attempt 1)``; ``?`` when no window was counted."""
    spans = sorted(tallies.steps.items())
    if len(spans) == 1:
        return f"{spans[0][1][0]}-{spans[0][1][1]}"
    return ", ".join(f"{first}-{last} (attempt {a})" for a, (first, last) in spans) or "?"
