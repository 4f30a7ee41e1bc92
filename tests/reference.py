"""A deliberately slow, pure-Python reference for the frontier accounting.

Written from the paper's formulas with plain loops over nested lists; it never calls the package,
so the tests can compare the vectorized analyzer against an independent implementation.

Input ``d`` is anything indexable as ``d[t][r][s]`` (a nested list or a numpy array): step ``t``,
rank ``r``, ordered stage ``s``, durations in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Matrix = list[list[float]]
Cube = list[list[list[float]]]


def to_lists(d: Any) -> Cube:
    """Copy ``d`` into nested Python lists of floats."""
    return [[[float(v) for v in stage_row] for stage_row in rank_rows] for rank_rows in d]


def shape(d: Cube) -> tuple[int, int, int]:
    return len(d), len(d[0]), len(d[0][0])


def median(values: Sequence[float]) -> float:
    """Median of a non-empty list: the middle value, or the mean of the two middle values."""
    ordered = sorted(values)
    k = len(ordered)
    if k % 2 == 1:
        return ordered[k // 2]
    return 0.5 * (ordered[k // 2 - 1] + ordered[k // 2])


# --- prefixes, frontier, advances, shares, slack ---------------------------------------------


def per_row(cube: Cube, row: Callable[[int, int], list[float]]) -> Cube:
    """A cube of ``cube``'s steps and ranks whose row ``[t][r]`` is ``row(t, r)``."""
    n, r_count, _ = shape(cube)
    return [[row(t, r) for r in range(r_count)] for t in range(n)]


def prefixes(d: Any) -> Cube:
    """``P[t][r][s] = sum_{j <= s} d[t][r][j]``."""
    d = to_lists(d)

    def running_sums(t: int, r: int) -> list[float]:
        running = 0.0
        row = []
        for value in d[t][r]:
            running += value
            row.append(running)
        return row

    return per_row(d, running_sums)


def max_over_ranks(cube: Cube, value: Callable[[int, int, int], float]) -> Matrix:
    """``M[t][s] = max_r value(t, r, s)`` over ``cube``'s steps, ranks and stages."""
    n, r_count, s_count = shape(cube)
    out = []
    for t in range(n):
        row = []
        for s in range(s_count):
            best = value(t, 0, s)
            for r in range(1, r_count):
                best = max(best, value(t, r, s))
            row.append(best)
        out.append(row)
    return out


def frontier(d: Any) -> Matrix:
    """``F[t][s] = max_r P[t][r][s]``."""
    p = prefixes(d)
    return max_over_ranks(p, lambda t, r, s: p[t][r][s])


def advances(d: Any) -> Matrix:
    """``a[t][s] = F[t][s] - F[t][s-1]`` with ``F[t][-1] = 0``."""
    f = frontier(d)
    out = []
    for row in f:
        previous = 0.0
        adv = []
        for value in row:
            adv.append(value - previous)
            previous = value
        out.append(adv)
    return out


def step_exposed(d: Any) -> list[float]:
    """``F[t][S]``, the exposed time of every step."""
    return [row[-1] for row in frontier(d)]


def advance_totals(d: Any) -> list[float]:
    """``sum_t a[t][s]`` per stage."""
    a = advances(d)
    totals = [0.0] * len(a[0])
    for row in a:
        for s, value in enumerate(row):
            totals[s] += value
    return totals


def exposed(d: Any) -> float:
    """``sum_t F[t][S]``."""
    return sum(step_exposed(d))


def shares(d: Any) -> list[float]:
    """``A_s = sum_t a[t][s] / sum_t F[t][S]``."""
    totals = advance_totals(d)
    denominator = exposed(d)
    return [value / denominator for value in totals]


def slack(d: Any) -> Cube:
    """``lambda[t][r][s] = F[t][s-1] - P[t][r][s-1]``, zero at the first stage."""
    p = prefixes(d)
    f = frontier(d)
    s_count = shape(p)[2]

    def behind(t: int, r: int) -> list[float]:
        return [0.0] + [f[t][s - 1] - p[t][r][s - 1] for s in range(1, s_count)]

    return per_row(p, behind)


def advances_from_slack(d: Any) -> Matrix:
    """The slack identity's right-hand side ``max_r (d[t][r][s] - lambda[t][r][s])``."""
    d = to_lists(d)
    lam = slack(d)
    return max_over_ranks(d, lambda t, r, s: d[t][r][s] - lam[t][r][s])


# --- bounds and baselines ----------------------------------------------------------------------


def per_stage_max_sum(d: Any) -> list[float]:
    """``M_t = sum_s max_r d[t][r][s]`` per step."""
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    return [sum(max(d[t][r][s] for r in range(r_count)) for s in range(s_count)) for t in range(n)]


def per_stage_mean_sum(d: Any) -> list[float]:
    """``Mbar_t = sum_s (1/R) sum_r d[t][r][s]`` per step."""
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    return [
        sum(sum(d[t][r][s] for r in range(r_count)) / r_count for s in range(s_count))
        for t in range(n)
    ]


def _normalize(values: list[float]) -> list[float]:
    total = sum(values)
    if total <= 0:
        return [0.0 for _ in values]
    return [v / total for v in values]


def per_stage_max_shares(d: Any) -> list[float]:
    """Shares of ``sum_t max_r d[t][r][s]``."""
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    totals = [
        sum(max(d[t][r][s] for r in range(r_count)) for t in range(n)) for s in range(s_count)
    ]
    return _normalize(totals)


def per_stage_mean_shares(d: Any) -> list[float]:
    """Shares of ``sum_t mean_r d[t][r][s]``."""
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    totals = [
        sum(sum(d[t][r][s] for r in range(r_count)) / r_count for t in range(n))
        for s in range(s_count)
    ]
    return _normalize(totals)


# --- direct-exposure gain ------------------------------------------------------------------------


def baseline_values(d: Any, kind: str, reference: Sequence[Any] | None = None) -> Cube:
    """The unclipped baseline ``b~[t][r][s]`` of each rule.

    ``rank_median``: the rank's median of the stage over the window's steps.
    ``cohort_median``: the step's median of the stage over ranks.
    ``reference``: a caller-given ``[S]`` or ``[R][S]`` no-stall duration.
    """
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    out: Cube = [[[0.0] * s_count for _ in range(r_count)] for _ in range(n)]
    for t in range(n):
        for r in range(r_count):
            for s in range(s_count):
                if kind == "rank_median":
                    value = median([d[u][r][s] for u in range(n)])
                elif kind == "cohort_median":
                    value = median([d[t][q][s] for q in range(r_count)])
                elif kind == "reference":
                    assert reference is not None
                    per_rank = hasattr(reference[0], "__len__")
                    value = float(reference[r][s]) if per_rank else float(reference[s])
                else:
                    raise ValueError(kind)
                out[t][r][s] = value
    return out


def direct_gain(
    d: Any, kind: str = "rank_median", reference: Sequence[Any] | None = None
) -> list[float]:
    """``G_s = sum_t (F[t][S] - F^(s<-b)[t][S]) / sum_t F[t][S]`` with ``b = min(d, b~)``.

    The counterfactual frontier is recomputed from scratch on a copy of the window in which stage
    ``s`` is replaced by its clipped baseline on every rank and step.
    """
    d = to_lists(d)
    n, r_count, s_count = shape(d)
    base = baseline_values(d, kind, reference)
    original = step_exposed(d)
    denominator = sum(original)
    gains = []
    for s in range(s_count):
        replaced = [[list(row) for row in step] for step in d]
        for t in range(n):
            for r in range(r_count):
                replaced[t][r][s] = min(d[t][r][s], base[t][r][s])
        counterfactual = step_exposed(replaced)
        removed = sum(original[t] - counterfactual[t] for t in range(n))
        gains.append(removed / denominator)
    return gains


# --- localization ------------------------------------------------------------------------------


def lag(d: Any) -> Matrix:
    """``L[t][s] = max_r P[t][r][s] - median_r P[t][r][s]``."""
    p = prefixes(d)
    n, r_count, s_count = shape(p)
    return [
        [
            max(p[t][r][s] for r in range(r_count)) - median([p[t][r][s] for r in range(r_count)])
            for s in range(s_count)
        ]
        for t in range(n)
    ]


def lag_means(d: Any) -> list[float]:
    """Mean lag over steps at every boundary."""
    lags = lag(d)
    n = len(lags)
    return [sum(lags[t][s] for t in range(n)) / n for s in range(len(lags[0]))]


def delta_lag_means(d: Any) -> list[float]:
    """Mean over steps of ``L[t][s] - L[t][s-1]`` (with ``L[t][-1] = 0``)."""
    lags = lag(d)
    n = len(lags)
    s_count = len(lags[0])
    out = []
    for s in range(s_count):
        total = 0.0
        for t in range(n):
            total += lags[t][s] - (lags[t][s - 1] if s > 0 else 0.0)
        out.append(total / n)
    return out


def gap_means(d: Any) -> list[float] | None:
    """Mean over steps of the leading prefix minus the second-largest prefix; None with one rank."""
    p = prefixes(d)
    n, r_count, s_count = shape(p)
    if r_count < 2:
        return None
    out = []
    for s in range(s_count):
        total = 0.0
        for t in range(n):
            column = sorted((p[t][r][s] for r in range(r_count)), reverse=True)
            total += column[0] - column[1]
        out.append(total / n)
    return out


def tie_sets(d: Any, tie: float) -> list[list[list[int]]]:
    """Ranks within ``tie * F[t][S]`` of the frontier at each boundary: ``[t][s] -> ranks``."""
    p = prefixes(d)
    f = frontier(d)
    n, r_count, s_count = shape(p)
    out = []
    for t in range(n):
        tolerance = tie * f[t][-1]
        out.append(
            [
                [r for r in range(r_count) if p[t][r][s] >= f[t][s] - tolerance]
                for s in range(s_count)
            ]
        )
    return out


def localization(d: Any, tie: float = 0.02) -> list[dict[str, Any]]:
    """Leader evidence per stage, counted only over steps with a confident unique leader.

    ``leader_rank`` is the rank whose uniquely led steps carry the most of the stage's advance
    (lowest rank on equal weight; the most frequently leading rank when every such advance is
    zero); ``leader_switches`` counts leader changes between consecutive confident steps.
    """
    a = advances(d)
    ties = tie_sets(d, tie)
    n, s_count = len(a), len(a[0])
    r_count = len(to_lists(d)[0])
    out = []
    for s in range(s_count):
        sequence: list[int] = []
        weight = [0.0] * r_count
        count = [0] * r_count
        for t in range(n):
            if len(ties[t][s]) == 1:
                rank = ties[t][s][0]
                sequence.append(rank)
                weight[rank] += a[t][s]
                count[rank] += 1
        if not sequence:
            leader = None
        elif any(w != 0.0 for w in weight):
            leader = max(range(r_count), key=lambda r: (weight[r], -r))
        else:
            leader = max(range(r_count), key=lambda r: (count[r], -r))
        switches = sum(1 for i in range(1, len(sequence)) if sequence[i] != sequence[i - 1])
        tied_counts = [0] * r_count
        for t in range(n):
            if len(ties[t][s]) > 1:
                for rank in ties[t][s]:
                    tied_counts[rank] += 1
        out.append(
            {
                "leader_rank": leader,
                "confident_steps": len(sequence),
                "leader_switches": switches,
                "tied_ranks": sorted(
                    (r for r in range(r_count) if tied_counts[r] > 0),
                    key=lambda r: (-tied_counts[r], r),
                ),
            }
        )
    return out
