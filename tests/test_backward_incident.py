"""A rank late into backward, as a user sees it: a real 4-rank Gloo DDP demo with a 400 ms delay
inside autograd on rank 1 (the demo's ``backward_compute`` fault: a hook on the first parameter's
gradient, computed last in backward, sleeps) and the profiler router on.

DDP's all-reduce makes ranks 0, 2 and 3 wait inside backward for rank 1, so backward's share is
the same on every rank: no comparison of the stage's time can name rank 1. The collectives name
it (``timer.watch_ddp``), and the capture proves it by rank 1's own work in the stage: the op
diff's top entry is the function the hook sleeps in. One run serves every assertion: the
incident on rank 1 is confirmed by the delay's own function, its verdict and reasons say so, and
the report's per-window leader column names the late rank as the window line does. Nothing
asserts a duration.

The delay is large against the scheduling noise of the ranks' arrival at the all-reduce: at load
60-70 on this 2-core machine, with 420-775 ms steps, a 100 ms delay left rank 1 late in too few
steps to name it. Windows of 10 steps keep the run short: four of its six windows run the delay.
The router captures a late rank once it was late two windows in a row (``route.decide``), so the
capture runs in the fifth window and the sixth covers any start margin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD
from stagefrontier.cli import main
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.render.incident import summary_line
from trace_support import settled_incidents

STAGE = "model.backward_cpu_wall"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = launch(
        DemoConfig(
            ranks=4,
            steps=60,
            window=10,
            faults=(parse_fault("backward_compute@1:400ms,from=20"),),
            out_dir=str(tmp_path_factory.mktemp("backward") / "run"),
            collect_timeout_s=10.0,
            quiet=True,
            router=True,
            router_timeout_s=20.0,
        ),
        deadline_s=600.0,  # 60 steps of four ranks on a 2-core machine at any load
        start_method=START_METHOD,
    )
    return Path(run.out_dir)


@pytest.fixture(scope="module")
def incident(run_dir: Path) -> dict[str, Any]:
    incidents = settled_incidents(run_dir)
    assert len(incidents) == 1, [(i["stage"], i["leader_rank"], i["reasons"]) for i in incidents]
    return incidents[0]


def test_the_late_rank_is_confirmed_by_its_own_work(incident: dict[str, Any]) -> None:
    assert (incident["stage"], incident["leader_rank"]) == (STAGE, 1), incident["reasons"]
    assert incident["captured"], incident["reasons"]
    assert incident["confirmed"] is True, (incident["reasons"], incident["op_diff"][:2])
    assert "faults.py" in incident["op_diff"][0]["name"], incident["op_diff"][:2]
    said = [r for r in incident["reasons"] if r.startswith("confirmed by rank 1's own work")]
    assert said and "faults.py" in said[0], incident["reasons"]
    assert not any(r.startswith("not confirmed") for r in incident["reasons"]), incident["reasons"]


def test_the_summary_line_says_confirmed_without_a_contradiction(incident: dict[str, Any]) -> None:
    line = summary_line(incident)
    assert "| confirmed |" in line and "not confirmed" not in line and "agree" not in line, line


def test_the_report_names_the_late_rank_as_the_window_line_does(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run_dir)]) == 0
    table = capsys.readouterr().out.split("Per window", 1)[1].split("\n\n", 1)[0]
    late = [line for line in table.splitlines() if "rank 1 late into its last bucket" in line]
    assert len(late) >= 2, table  # windows 2-5, each all after the fault began
    assert not any("no single leader" in line for line in late), table
    page = run_dir / "report.html"
    assert main(["report", str(run_dir), "--html", str(page)]) == 0
    assert "rank 1 late into its last bucket" in page.read_text(encoding="utf-8")
