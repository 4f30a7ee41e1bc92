"""The GitHub Actions recipe of docs/ci.md runs: its shell steps are read from the page's workflow
and run in an empty folder, the baseline job's training beside the gate job's, then the gate
job's other steps in order, all but the steps that need the network (the install, and the
artifact download, for which the baseline job's folder stands in, as the artifact would).

Two real 2-rank demo trainings of the recipe's length run side by side (one after the other they
took 30 s at a load of 3); whether the gate passes depends on how the machine's load fell on the
two runs (the gate's decisions are tested in test_compare_gate.py), so this checks
that the gate's commands run, write their three files and say the same outcome in the exit
status, the Markdown and the JUnit XML."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("torch")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "ci.md"
NETWORK_STEPS = {"install", "download"}
OUTCOMES = {0: "passed", 1: "failed", 3: "could not judge"}


def workflow() -> dict[str, Any]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    assert len(blocks) == 1, "docs/ci.md holds one workflow"
    loaded: dict[str, Any] = yaml.safe_load(blocks[0])
    return loaded


def shell_steps(job: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (s["id"], s["run"]) for s in job["steps"] if "run" in s and s["id"] not in NETWORK_STEPS
    ]


def test_the_recipe_trains_a_baseline_and_gates_on_it(tmp_path: Path) -> None:
    jobs = workflow()["jobs"]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    baseline, gate = shell_steps(jobs["baseline"]), shell_steps(jobs["gate"])
    assert [name for name, _ in baseline + gate] == ["train", "train", "gate", "summary"]

    def run(step: tuple[str, str]) -> int:
        name, command = step
        proc = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if name != "gate":
            assert proc.returncode == 0, f"{name}: {command}\n{proc.stdout[-2000:]}{proc.stderr}"
        return proc.returncode

    # The two trainings run side by side, as a push to main and a pull request would: the gate
    # job reads the baseline's folder only at its gate step.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(run, [baseline[0], gate[0]]))
    status = {name: run((name, command)) for name, command in gate[1:]}
    assert status["gate"] in OUTCOMES, status
    markdown = (tmp_path / "gate.md").read_text()
    assert markdown.startswith(f"### Step-time gate {OUTCOMES[status['gate']]} (10%)")
    assert (tmp_path / "summary.md").read_text() == markdown
    suite = ET.parse(tmp_path / "gate.xml").getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("failures"), suite.get("errors")) == {
        0: ("0", "0"),
        1: ("1", "0"),
        3: ("0", "1"),
    }[status["gate"]]
    assert (tmp_path / "gate.png").read_bytes().startswith(b"\x89PNG")
