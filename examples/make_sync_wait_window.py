"""Write ``sync_wait_window.npz``: a seeded 4-rank, 50-step window with a hidden data stall.

Rank 2 stalls in ``data.next_wait`` (about 120 ms per step); the other ranks reach backward's
gradient synchronization early and wait there, so their host-visible backward time is their own
work plus the wait. Per-stage maxima and means blame backward; the frontier charges the stall to
the data boundary, led by rank 2. With default gates the window is labeled ``co_critical``
(the matrix alone cannot prove the backward time is wait); a caller who knows the workload
synchronizes in backward can pass ``Gates(model_fit_stages={"data.next_wait"})`` and get
``sync_wait_dependent`` and ``likely_sync_wait`` instead.

Run ``python examples/make_sync_wait_window.py`` and then
``stagefrontier analyze examples/sync_wait_window.npz``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stagefrontier import DEFAULT_STAGES

STEPS, RANKS, STALLED_RANK, SEED = 50, 4, 2, 20240601
OUT = Path(__file__).with_name("sync_wait_window.npz")

# Typical per-stage work (seconds): data, fwd+loss, backward, callbacks, optimizer, residual.
BASE = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])


def make_window(rng: np.random.Generator) -> np.ndarray:
    """Durations ``[steps, ranks, stages]`` in seconds, with the stall absorbed in backward."""
    data = DEFAULT_STAGES.index("data.next_wait")
    backward = DEFAULT_STAGES.index("model.backward_cpu_wall")
    work = BASE * (1 + 0.03 * rng.standard_normal((STEPS, RANKS, len(DEFAULT_STAGES))))
    work[:, STALLED_RANK, data] += rng.normal(0.120, 0.010, size=STEPS)
    # Each rank enters backward, does its own work, then waits in the gradient all-reduce until
    # the last rank arrives; the collective then takes a few milliseconds for everyone.
    enters = work[:, :, :backward].sum(axis=2)
    done = (enters + work[:, :, backward]).max(axis=1) + rng.uniform(0.002, 0.004, size=STEPS)
    d = work.copy()
    d[:, :, backward] = done[:, None] - enters
    return np.round(d, 9)  # whole nanoseconds, as a timer reports them


def main() -> None:
    d = make_window(np.random.default_rng(SEED))
    np.savez_compressed(OUT, d=d, stages=np.array(DEFAULT_STAGES))
    print(f"wrote {OUT.name}: d {d.shape}, stages {list(DEFAULT_STAGES)}")


if __name__ == "__main__":
    main()
