"""What several test files share, made once per session (per worker under pytest-xdist): the
real-rank runs they assert on (a test that needs one names its fixture instead of launching the
job again; each is a real spawned Gloo job, skipped without torch) and the committed real
profiler traces (tests/data/traces, readable without torch).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from machine_support import MARK, hold_machine
from rank_support import START_METHOD
from trace_support import trace


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}: the test runs with no other pytest worker's test beside it (machine_support)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Each test, with the fixtures set up for it, holds the machine: exclusively when marked
    ``machine_to_itself``, else shared (``machine_support``; nothing without pytest-xdist)."""
    with hold_machine(alone=item.get_closest_marker(MARK) is not None):
        yield


DEMO_STEPS = 30
DEMO_WINDOW = 10
"""The shape of every 2-rank demo run in tests/test_distributed.py."""
DEMO_DEADLINE_S = 240.0


@pytest.fixture(scope="session")
def untimed_demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The demo's 2-rank DDP run with every timer off (``stagefrontier.demo.launch``): the losses
    a faulty run must reproduce (faults only sleep), and the wall time of a whole run on this
    machine at its present load, from which a test derives its deadlines."""
    pytest.importorskip("torch")
    from stagefrontier.demo import DemoConfig, launch

    config = DemoConfig(
        ranks=2,
        steps=DEMO_STEPS,
        window=DEMO_WINDOW,
        out_dir=str(tmp_path_factory.mktemp("untimed-demo")),
        timed=False,
        quiet=True,
    )
    run = launch(config, deadline_s=DEMO_DEADLINE_S, start_method=START_METHOD)
    assert run.windows == []
    return run


def demo_fault_ms(untimed: Any, ranks: int) -> int:
    """A delay large against the step: four times the median step of this session's untimed
    2-rank run (``untimed_demo``, at the machine's present load), scaled by the ranks sharing
    the cores, and at least 120 ms, so a loaded machine's slower all-reduce never outweighs it."""
    import numpy as np

    step_s = float(np.median([s for steps in untimed.step_s.values() for s in steps]))
    return max(120, round(4000 * step_s * ranks / 2))


PathRun = tuple[Path, list[dict[str, Any]]]
"""A router path job's output folder and its settled incidents."""


@pytest.fixture(scope="session")
def router_path_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], PathRun]:
    """The router path tests' 4-rank torchrun job (``router_paths_support.run_path_job``) with
    its two stalls one after the other (``router_paths_support.STALLS``: data, then forward),
    run once per session for each path asked for (20 to 40 s a job on a loaded 2-core machine;
    a job per stall would start twice as many ranks): the path's data and forward cases of
    ``test_router_paths`` read the same job, and ``test_accumulation_fetch`` the accumulation
    path's. A test reads the folder, never writes into it."""
    pytest.importorskip("torch")
    from router_paths_support import run_path_job

    runs: dict[str, PathRun] = {}

    def run(path: str) -> PathRun:
        if path not in runs:
            out = tmp_path_factory.mktemp(f"router-{path}") / "out"
            runs[path] = (out, run_path_job(out, path, "stalls"))
        return runs[path]

    return run


@pytest.fixture(scope="session")
def gloo_dir() -> Path:
    """The committed traces of a real 2-rank Gloo DDP job (``trace_support``), one per rank."""
    return trace("gloo-2-ranks")


@pytest.fixture(scope="session")
def single() -> Path:
    """The committed trace of one profiled process, four steps (``trace_support``)."""
    return trace("single-4-steps.json")


@pytest.fixture(scope="session")
def untimed_job_losses(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[float]]:
    """The losses of the collection tests' 2-rank job (``collect_support.Job`` defaults: 30
    steps) with every timer off; faults only sleep or drop windows, so every timed run of that
    job must reproduce them."""
    pytest.importorskip("torch")
    from collect_support import Job, launch

    run = launch(Job(out_dir=str(tmp_path_factory.mktemp("untimed-job")), collect="off"))
    assert run.windows == []
    return run.losses


@pytest.fixture(scope="session")
def forward_stall_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``stagefrontier run --router`` on examples/unmodified/train_ddp.py, 4 ranks, no
    DataLoader workers, rank 1's forward 120 ms slow (``slow_forward``), 50 steps; 30 to 40 s
    on a loaded 2-core machine."""
    pytest.importorskip("torch")
    from auto_support import run_unmodified

    out = tmp_path_factory.mktemp("forward-stall")
    return run_unmodified(out, "train_ddp.py", "--stall", "forward@1")


@pytest.fixture(scope="session")
def data_stall_run(tmp_path_factory: pytest.TempPathFactory, untimed_demo: Any) -> Any:
    """The same with 2 DataLoader workers per rank and rank 2's samples slow (``slow_sample``:
    ``demo_fault_ms`` of stall per step, sized for 4 ranks from this session's untimed run, 120
    ms at least: a fixed 120 ms, against a loaded machine's longer steps, left the lead of one
    window under the bar an incident needs); 30 to 40 s."""
    pytest.importorskip("torch")
    from auto_support import RANKS, run_unmodified

    out = tmp_path_factory.mktemp("data-stall")
    stall = f"data@2:{demo_fault_ms(untimed_demo, RANKS)}ms"
    return run_unmodified(out, "train_ddp.py", "--stall", stall, "--workers", "2")


GATE_STEPS = 100
GATE_WINDOW = 20
GATE_STALL = "data@1:120ms"
GATE_BURNERS = 2
"""CPU-burning processes beside the gate's three jobs (the issue's healthy pairs must pass beside
them, the stall still fail)."""
GATE_HEAVIER_LAYERS = 12
"""The heavier model's layers (the demo's has 2): every stage on every rank slower, the code's."""
GATE_QUIET_STEPS = 60


@pytest.fixture(scope="session")
def gate_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Output folders of the demo's 2-rank DDP job for the compare gate: ``base`` and
    ``healthy`` (no fault) and ``stalled`` (a 120 ms data stall on rank 1 every step), launched
    side by side so that the three share the machine's load, beside ``GATE_BURNERS`` processes
    that burn CPU; then, with the burners gone, side by side again: ``quiet`` (no fault),
    ``heavier`` (a model of ``GATE_HEAVIER_LAYERS`` layers) and ``three_ranks`` (a healthy
    3-rank run, another world size)."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from stagefrontier.demo import DemoConfig, launch, parse_fault

    root = tmp_path_factory.mktemp("gate-runs")

    def run(
        name: str,
        ranks: int = 2,
        fault: str | None = None,
        steps: int = GATE_STEPS,
        layers: int = 2,
    ) -> Path:
        config = DemoConfig(
            ranks=ranks,
            steps=steps,
            window=GATE_WINDOW,
            faults=(parse_fault(fault),) if fault else (),
            out_dir=str(root / name),
            quiet=True,
            collect_timeout_s=30.0,
            n_layers=layers,
        )
        launch(config, deadline_s=DEMO_DEADLINE_S, start_method=START_METHOD)
        return root / name

    burn = [sys.executable, "-c", "while True: pass"]
    burners = [subprocess.Popen(burn) for _ in range(GATE_BURNERS)]
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = {
                name: pool.submit(run, name, fault=fault)
                for name, fault in (("base", None), ("healthy", None), ("stalled", GATE_STALL))
            }
            runs = {name: future.result() for name, future in futures.items()}
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    with ThreadPoolExecutor(3) as pool:
        futures = {
            "quiet": pool.submit(run, "quiet", steps=GATE_QUIET_STEPS),
            "heavier": pool.submit(
                run, "heavier", steps=GATE_QUIET_STEPS, layers=GATE_HEAVIER_LAYERS
            ),
            "three_ranks": pool.submit(run, "three_ranks", ranks=3),
        }
        runs.update({name: future.result() for name, future in futures.items()})
    return runs


@pytest.fixture(scope="session")
def budget_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output folder of ``budget_support``'s 2-rank job launched twice into it (the second
    launch a job resumed from a checkpoint): ``BUDGET_WINDOWS`` windows an attempt under a
    ``BUDGET_MB`` MiB disk budget, regressions injected at ``BUDGET_SLOW``, one incident asked by
    hand in each; each launch ends once its incident pages are drawn (``launch``), so no process
    writes into the folder after it. A test that writes into the folder works on a copy of it
    (``shutil.copytree``) or writes only what every reader of it expects (``report.html``)."""
    pytest.importorskip("torch")
    from budget_support import BUDGET_MB, BUDGET_SLOW, BUDGET_WINDOWS, BudgetJob, launch

    out = tmp_path_factory.mktemp("budget") / "run"
    for attempt in (0, 1):
        job = BudgetJob(str(out), BUDGET_WINDOWS, BUDGET_SLOW[attempt], BUDGET_MB, router=True)
        launch(job)
    return out
