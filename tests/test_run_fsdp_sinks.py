"""``stagefrontier run --sink tensorboard:DIR --sink prometheus:PORT`` on an unmodified FSDP2
script (``fully_shard``), 4 real Gloo ranks on torchrun's launcher: the forward is timed from
the outermost module, and both sinks show the windows of ``windows.jsonl``.

Cost: one shared job (a module fixture, 31 steps; 30 to 60 s on a loaded 2-core machine). The
job holds before its end until the fixture has scraped the Prometheus endpoint, which lives
as long as rank 0's timer; rank 0 says where it serves (the sink binds a port of the kernel's
choosing), and the fixture reads that line as the job runs. Nothing asserts a duration.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytest.importorskip("prometheus_client")

from auto_support import (
    DEADLINE_S,
    RANKS,
    RUN_ENV,
    SCRIPTS,
    AutoRun,
    finished,
    run_command,
)

STEPS = 31  # the first is watched, not timed: three windows of 10
LAST_WINDOW = 2
FORWARD = "model.fwd_loss_cpu_wall"
COMPUTE_S = 0.02  # train_sharded.py's sleep in the root's forward


@dataclass
class SinkedRun:
    run: AutoRun
    tensorboard: Path
    scraped: dict[str, Any]  # metric families of the last window, read while the job held


SERVING = re.compile(r"Prometheus metrics at (http://\S+)")
"""Rank 0's line saying where its sink serves (``--sink prometheus:0``: a port the kernel picks as
the sink binds it, so no other job can take it first)."""


def _scrape(url: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return {}  # not serving yet
    return {f.name: f for f in text_string_to_metric_families(text)}


def _read_lines(job: subprocess.Popen[str], lines: list[str]) -> None:
    for line in job.stdout or ():
        lines.append(line)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory) -> SinkedRun:
    root = tmp_path_factory.mktemp("fsdp-sinks")
    out, tensorboard, held = root / "sf", root / "tb", root / "scraped"
    command = run_command(
        out,
        SCRIPTS / "train_sharded.py",
        ("--steps", str(STEPS), "--hold", str(held)),
        router=False,
        options=("--sink", f"tensorboard:{tensorboard}", "--sink", "prometheus:0"),
    )
    job = subprocess.Popen(
        command, env=RUN_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []  # the job's output, read as it comes so that the URL can be found
    reader = threading.Thread(target=_read_lines, args=(job, lines), daemon=True)
    reader.start()
    scraped: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + DEADLINE_S
        while job.poll() is None and time.monotonic() < deadline:
            urls = [m.group(1) for m in map(SERVING.search, list(lines)) if m]
            families = _scrape(urls[0]) if urls else {}
            window = families.get("stagefrontier_window")
            if window is not None and window.samples[0].value == LAST_WINDOW:
                scraped = families  # the last window, analyzed while every rank holds
                break
            time.sleep(0.1)
    finally:
        held.touch()
        job.wait(DEADLINE_S)
        reader.join(DEADLINE_S)
    output = "".join(lines)
    return SinkedRun(finished(out, job.returncode, output), tensorboard, scraped)


def test_fsdp2_is_timed_from_the_outermost_module(fsdp_run: SinkedRun) -> None:
    run = fsdp_run.run
    assert "Traceback" not in run.output, run.output[-6000:]
    assert "trained 31 steps (FSDPNet)" in run.output
    assert [r["n_steps"] for r in run.records] == [10, 10, 10]
    for record in run.records:
        assert record["ranks_present"] == list(range(RANKS))
        assert record["contract_violations"] == 0
        # every rank sleeps in the root's forward before its sharded layers run: a forward
        # stage that began at an inner layer would leave the sleep to the residual
        assert record["advances"][FORWARD] >= COMPUTE_S * record["n_steps"], record["advances"]


def test_the_tensorboard_sink_writes_every_window(fsdp_run: SinkedRun) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = fsdp_run.run.records
    events = EventAccumulator(str(fsdp_run.tensorboard), size_guidance={"scalars": 0})
    events.Reload()
    for stage in records[0]["stages"]:
        got = [(e.step, e.value) for e in events.Scalars(f"stagefrontier/share/{stage}")]
        want = [(r["last_step"], r["semantic_shares"][stage]) for r in records]
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-7)


def test_the_prometheus_sink_serves_the_last_window(fsdp_run: SinkedRun) -> None:
    families, last = fsdp_run.scraped, fsdp_run.run.records[-1]
    assert families, "the endpoint never served the last window while the job held"
    assert families["stagefrontier_last_step"].samples[0].value == last["last_step"]
    assert families["stagefrontier_ranks_present"].samples[0].value == RANKS
    shares = {s.labels["stage"]: s.value for s in families["stagefrontier_stage_share"].samples}
    assert shares == pytest.approx(last["semantic_shares"], rel=1e-6, abs=1e-7)
    top = {s.labels["stage"]: s.value for s in families["stagefrontier_top_stage"].samples}
    assert top[last["top1"]] == 1


def test_the_fsdp2_all_gathers_and_reduce_scatters_are_timed(fsdp_run: SinkedRun) -> None:
    """``stagefrontier run`` finds the FSDP2 modules and times their collectives
    (``timer.watch_fsdp``): each sharded linear layer's all-gather in forward, again in
    backward with its reduce-scatter, numbered by their order in the stage."""
    layers = [0, 1]  # train_sharded.py shards its two linear layers; the root holds none
    for record in fsdp_run.run.records:
        order: dict[tuple[str, str], list[int]] = {}
        for c in record["communication"]["collectives"]:
            order.setdefault((c["family"], c["stage"]), []).append(c["bucket"])
        assert {where: sorted(b) for where, b in order.items()} == {
            ("all_gather", FORWARD): layers,
            ("all_gather", "model.backward_cpu_wall"): layers,
            ("reduce_scatter", "model.backward_cpu_wall"): layers,
        }, record["communication"]
