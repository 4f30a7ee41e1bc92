"""``stagefrontier compare --fail-above``: the performance gate, on real demo runs (the session's
``gate_runs``: a healthy base, a second healthy run and a run with a 120 ms data stall on rank 1,
launched side by side beside two CPU-burning processes; a 3-rank run) and on packet folders for
the refusals and bad inputs.

``benchmarks/gate.py`` runs ten healthy pairs, quiet and beside CPU-burning processes; here one
pair, beside burners, is judged both ways round."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from cli_support import console_script
from stagefrontier.analysis.gate import parse_percent
from test_compare import DATA, healthy, write_run

pytestmark = pytest.mark.machine_to_itself  # jobs side by side or beside its own burners

PASS, FAIL, BAD_INPUT, NOT_COMPARABLE = 0, 1, 2, 3


def gate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*console_script(), "compare", *args], capture_output=True, text=True, timeout=120
    )


def gate_json(base: Path | str, new: Path | str, *args: str) -> tuple[int, dict[str, object]]:
    proc = gate(str(base), str(new), "--json", *args)
    assert proc.returncode != BAD_INPUT, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_data_stall_on_rank_1_fails_at_10_percent_and_is_named(
    gate_runs: dict[str, Path], tmp_path: Path
) -> None:
    md, xml, png = tmp_path / "gate.md", tmp_path / "gate.xml", tmp_path / "gate.png"
    proc = gate(
        str(gate_runs["base"]),
        str(gate_runs["stalled"]),
        *("--fail-above", "10%", "--markdown", str(md), "--junit", str(xml), "--plot", str(png)),
    )
    assert proc.returncode == FAIL, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("GATE FAIL: "))
    # The stage first, with its exact share of the change and rank 1 alone in it (a busy
    # machine may add a stage that grew on every rank after it).
    grew = re.search(
        r"grew: data\.next_wait \+(\d+\.\d) ms/step \((\d+\.\d)% of the change; ([^)]*)\)", line
    )
    assert grew, line
    # At least the stall's 120 ms (less its share of the noise); a busy machine wakes a sleeping
    # rank late, so it may be more.
    assert 0.85 * 120 <= float(grew[1]) <= 1.5 * 120, line
    assert re.fullmatch(r"rank 1 \+\d+\.\d ms", grew[3]), line
    assert "past the 10% bar" in line
    assert md.read_text().startswith("### Step-time gate failed (10%)")
    assert "**data.next_wait**" in md.read_text()
    case = ET.parse(xml).getroot().find("testsuite/testcase")
    assert case is not None and case.find("failure") is not None
    assert png.read_bytes().startswith(b"\x89PNG")
    status, data = gate_json(gate_runs["base"], gate_runs["stalled"], "--fail-above", "10")
    verdict = data["gate"]
    assert status == FAIL and isinstance(verdict, dict) and verdict["outcome"] == "fail"
    top = verdict["grew"][0]
    assert top["stage"] == DATA and [r["rank"] for r in top["ranks"]] == [1]
    # The share is compare's exact split: the stage's delta over the exposed delta.
    delta = data["delta_advance_ms_per_step"]
    assert isinstance(delta, dict)
    assert top["share_of_change"] == pytest.approx(
        delta[DATA] / data["delta_exposed_ms_per_step"], rel=1e-12
    )


def test_a_stall_fails_when_its_stage_shows_it_though_the_median_step_hides_it(
    tmp_path: Path,
) -> None:
    # Steps of about 1 s, as the demo's are on a machine at a load of 60. While rank 1 sleeps
    # 120 ms in its data wait, it gets the cores back faster afterwards: its forward is 120 ms
    # shorter, the step no longer (the median moves by noise alone). The data stage's blocks
    # hold the stall to a few ms.
    base = write_run(tmp_path / "base", [healthy(0) * 10, healthy(1) * 10])
    stalled = [healthy(2) * 10, healthy(3) * 10]
    for d in stalled:
        d[:, 1, 0] += 0.120
        d[:, 1, 1] -= 0.120
    new = write_run(tmp_path / "new", stalled)
    status, data = gate_json(base, new, "--fail-above", "10%")
    verdict = data["gate"]
    assert status == FAIL and isinstance(verdict, dict), verdict
    assert abs(verdict["median_shift_ms"]) < verdict["bar_ms"], verdict
    assert re.match(
        r"data\.next_wait grew beyond its even share by 1\d\d\.\d ms/step, past the 10% bar "
        r"\(\d+\.\d ms\) and its own noise, though the median step moved less",
        str(verdict["reason"]),
    ), verdict
    top = verdict["grew"][0]
    assert top["stage"] == DATA and [r["rank"] for r in top["ranks"]] == [1], verdict


def test_a_faster_model_with_its_loader_unchanged_passes(tmp_path: Path) -> None:
    # The loader's 60 ms unchanged while the forward and backward run twice as fast: the rest of
    # the step shrank, which is no faster machine, so the loader keeps its BASE time as its
    # yardstick and nothing grew.
    def loader_bound(seed: int, model_speed: float) -> np.ndarray:
        d = healthy(seed)
        d[:, :, 0] += 0.056
        d[:, :, 1:3] *= model_speed
        return d

    base = write_run(tmp_path / "base", [loader_bound(0, 1.0), loader_bound(1, 1.0)])
    new = write_run(tmp_path / "new", [loader_bound(2, 0.5), loader_bound(3, 0.5)])
    status, data = gate_json(base, new, "--fail-above", "5%")
    verdict = data["gate"]
    assert isinstance(verdict, dict)
    assert verdict["median_shift_ms"] < -20, verdict
    assert status == PASS and verdict["grew"] == [], verdict


@pytest.mark.parametrize("order", ["base first", "healthy first"])
def test_two_healthy_runs_beside_cpu_burners_pass(gate_runs: dict[str, Path], order: str) -> None:
    pair = [gate_runs["base"], gate_runs["healthy"]]
    if order == "healthy first":
        pair.reverse()
    status, data = gate_json(*pair, "--fail-above", "10%")
    verdict = data["gate"]
    assert isinstance(verdict, dict)
    # Within the bar, or past it with no stage grown beyond its even share: the burners slowed
    # the whole job, and the gate says so rather than failing or refusing.
    assert status == PASS, verdict
    assert verdict["grew"] == []
    if verdict["median_shift_ms"] > verdict["bar_ms"]:
        assert verdict["whole_job"] and "the whole job slowed alike" in str(verdict["reason"])
    else:
        assert not verdict["whole_job"], verdict


def test_a_different_world_size_is_refused(gate_runs: dict[str, Path], tmp_path: Path) -> None:
    xml = tmp_path / "gate.xml"
    proc = gate(str(gate_runs["base"]), str(gate_runs["three_ranks"]), "--fail-above", "10%")
    assert proc.returncode == NOT_COMPARABLE, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines() == [
        f"GATE NOT COMPARABLE: {gate_runs['base']} -> {gate_runs['three_ranks']}: world sizes "
        "differ (2 ranks in BASE, 3 in NEW): a step of another world size is another job"
    ]
    gate(
        str(gate_runs["base"]),
        str(gate_runs["three_ranks"]),
        "--fail-above",
        "10%",
        "--junit",
        str(xml),
    )
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"


def test_an_absolute_bar_and_the_larger_of_two(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)])
    slower = [healthy(2), healthy(3)]
    for d in slower:
        d[:, :, 2] += 0.021  # the backward, on every rank: a step about 20% slower
    new = write_run(tmp_path / "new", slower)
    # 20% slower, little noise: fails at 10% or at 5 ms; passes at 10% and 50 ms together.
    assert gate_json(base, new, "--fail-above", "+10%")[0] == FAIL
    assert gate_json(base, new, "--fail-above-ms", "5")[0] == FAIL
    status, data = gate_json(base, new, "--fail-above", "10%", "--fail-above-ms", "50")
    assert status == PASS and data["gate"]["bar_ms"] == 50  # type: ignore[index]


def test_refusals_schema_and_too_few_steps(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)])
    renamed = write_run(
        tmp_path / "renamed", [healthy(2)], stages=(*[f"s{i}" for i in range(5)], "other")
    )
    status, data = gate_json(base, renamed, "--fail-above", "10%")
    assert status == NOT_COMPARABLE and "stage schemas differ" in str(data["gate"])
    short = write_run(tmp_path / "short", [healthy(3, steps=5)])
    status, data = gate_json(base, short, "--fail-above", "10%")
    assert status == NOT_COMPARABLE
    assert "NEW holds 5 steps, too few to resolve any bar (at least 8 a side)" in str(data["gate"])


def test_an_even_slowdown_passes_as_the_machines_and_strict_refuses_it(tmp_path: Path) -> None:
    # Steps that vary by half their length, every stage 12% slower on every rank: past the bar,
    # grown in no stage beyond its even share.
    noisy = [healthy(i) * (1 + (i % 2) * 0.5) for i in range(2)]
    base = write_run(tmp_path / "base", noisy)
    new = write_run(tmp_path / "new", [d * 1.12 for d in noisy[::-1]])
    status, data = gate_json(base, new, "--fail-above", "10%")
    verdict = data["gate"]
    assert status == PASS and isinstance(verdict, dict), verdict
    assert verdict["whole_job"] and verdict["median_shift_ms"] > verdict["bar_ms"], verdict
    assert "spread evenly over every stage and rank" in str(verdict["reason"])
    # Packets written before the host signals were kept: today's reading, and it says why.
    assert str(verdict["reason"]).endswith(
        "the host signals are missing (runs recorded before they were kept), so a slower "
        "machine cannot be told from slower code"
    )
    assert verdict["host_signals_missing"] and verdict["machine"] is None
    status, data = gate_json(base, new, "--fail-above", "10%", "--strict")
    verdict = data["gate"]
    assert status == NOT_COMPARABLE and isinstance(verdict, dict), verdict
    assert re.search(
        r"the whole job slowed alike.*about \d+ steps a side would tell it from the noise\); "
        r"--strict$",
        str(verdict["reason"]),
    )


def test_one_stage_grown_beyond_its_share_fails_even_inside_the_steps_noise(
    tmp_path: Path,
) -> None:
    # The same noisy steps; one stage, on every rank, 40 ms slower than its even share would be.
    noisy = [healthy(i) * (1 + (i % 2) * 0.5) for i in range(2)]
    base = write_run(tmp_path / "base", noisy)
    slower = [d.copy() for d in noisy[::-1]]
    for d in slower:
        d[:, :, 0] += 0.040
    new = write_run(tmp_path / "new", slower)
    status, data = gate_json(base, new, "--fail-above", "10%")
    verdict = data["gate"]
    assert status == FAIL and isinstance(verdict, dict), verdict
    assert "grew beyond its even share by more than the bar" in str(verdict["reason"])
    assert verdict["grew"][0]["stage"] == DATA


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fail-above", "ten"], "expected a positive percentage"),
        (["--fail-above=-10%"], "expected a positive percentage"),
        (["--fail-above-ms", "0"], "expected a positive number"),
        (["--markdown", "x.md"], "--markdown, --junit and --strict are the gate's"),
        (["--strict"], "--markdown, --junit and --strict are the gate's"),
    ],
)
def test_bad_gate_options_exit_2_in_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    base = write_run(tmp_path / "base", [healthy(0)])
    proc = gate(str(base), str(base), *args)
    assert proc.returncode == BAD_INPUT
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_percentages_are_read_with_or_without_sign_and_percent() -> None:
    assert [parse_percent(x) for x in ("10%", "+10%", "10", " 2.5 % ")] == [10, 10, 10, 2.5]


def test_a_stage_grown_on_every_rank_alike_is_said_so(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)])
    slower = [healthy(2), healthy(3)]
    for d in slower:
        d[:, :, 2] *= 1.5  # backward, on all four ranks
    new = write_run(tmp_path / "new", slower)
    proc = gate(str(base), str(new), "--fail-above", "10%")
    assert proc.returncode == FAIL, proc.stdout
    line = proc.stdout.strip().splitlines()[-1]
    assert re.search(
        r"grew: model\.backward_cpu_wall \+\d+\.\d ms/step \(\d+\.\d% of the change; "
        r"(rank \d \+\d+\.\d ms, ){3}rank \d \+\d+\.\d ms: every rank alike, "
        r"as on a slower host\)$",
        line,
    ), line


def test_stage_names_are_escaped_in_every_output(tmp_path: Path) -> None:
    stages = ("data\x1b[31m|`x", *[f"s{i}" for i in range(1, 6)])
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)], stages=stages)
    stalled = [healthy(2), healthy(3)]
    for d in stalled:
        d[:, 2, 0] += 0.120
    new = write_run(tmp_path / "new", stalled, stages=stages)
    md, xml = tmp_path / "gate.md", tmp_path / "gate.xml"
    proc = gate(
        str(base), str(new), "--fail-above", "10%", "--markdown", str(md), "--junit", str(xml)
    )
    assert proc.returncode == FAIL, proc.stdout
    assert "\x1b" not in proc.stdout + md.read_text() + xml.read_text()
    assert "grew: data\\x1b[31m|`x +" in proc.stdout
    assert "- **data\\x1b[31m\\|`x** +" in md.read_text()
    assert "| data\\x1b[31m\\|`x | " in md.read_text()
    failure = ET.parse(xml).getroot().find("testsuite/testcase/failure")
    assert failure is not None and "data\\x1b[31m|`x" in (failure.text or "")


QUIET_HOST = {"load_average": 1.0, "cpus": 2, "cpu_per_wall": 0.9, "steal_share": 0.0}


@pytest.mark.parametrize(
    "new_host, outcome",
    [
        (QUIET_HOST, "unchanged"),
        # The process got 12% less CPU a second, with more runnable threads than CPUs.
        ({**QUIET_HOST, "load_average": 3.0, "cpu_per_wall": 0.8}, "changed"),
        # As much less CPU a second, but nothing competed for it: a wait that is not a CPU's.
        ({**QUIET_HOST, "cpu_per_wall": 0.8}, "unchanged"),
        # The hypervisor took the CPU time.
        ({**QUIET_HOST, "cpu_per_wall": 0.8, "steal_share": 0.11}, "changed"),
    ],
)
def test_an_even_slowdown_fails_unless_the_host_signals_account_for_it(
    tmp_path: Path, new_host: dict[str, float], outcome: str
) -> None:
    # Every stage 12% slower on every rank, steps of little noise: past the bar and the noise.
    base = write_run(tmp_path / "base", [healthy(0), healthy(1)], host_signals=QUIET_HOST)
    new = write_run(tmp_path / "new", [healthy(2) * 1.12, healthy(3) * 1.12], host_signals=new_host)
    status, data = gate_json(base, new, "--fail-above", "10%")
    verdict = data["gate"]
    assert isinstance(verdict, dict) and verdict["machine"] is not None, verdict
    reason = str(verdict["reason"])
    assert "CPU per wall 0.9 -> " in reason, reason
    if outcome == "unchanged":
        assert status == FAIL and not verdict["whole_job"], verdict
        assert "every stage and rank grew, and the machine did not change" in reason
        assert verdict["grew"], verdict
    else:
        assert status == PASS and verdict["whole_job"], verdict
        assert "the whole job slowed alike" in reason and "; the machine changed (" in reason
        assert re.search(r"load 0\.5 -> 1\.5 per CPU|CPU steal 0% -> 11%", reason), reason
        strict = gate_json(base, new, "--fail-above", "10%", "--strict")
        assert strict[0] == NOT_COMPARABLE


def test_a_heavier_model_on_an_unchanged_machine_fails(gate_runs: dict[str, Path]) -> None:
    # Launched side by side, the two runs shared the machine: every stage of the heavier model
    # grew on every rank, its CPU time per step with it.
    status, data = gate_json(gate_runs["quiet"], gate_runs["heavier"], "--fail-above", "10%")
    verdict = data["gate"]
    assert status == FAIL and isinstance(verdict, dict), verdict
    assert not verdict["whole_job"], verdict
    reason = str(verdict["reason"])
    if "grew beyond its even share" in reason:
        # The stages do not grow alike with the layers (the optimizer's step works in
        # proportion to the parameters alone, the forward and backward also on fixed costs):
        # one of the model's stages may grow past its even share of the step, which fails the
        # gate before the host signals are read. Never the data wait: the batches are the same.
        assert re.search(r"(model|optim)\.\w+ grew beyond its even share", reason), reason
        assert verdict["machine"] is None, verdict
    else:
        assert "every stage and rank grew, and the machine did not change" in reason, reason
        assert not verdict["machine"]["explained"], verdict
        assert verdict["machine"]["code_ms"] > verdict["bar_ms"], verdict


def test_healthy_runs_with_burners_in_new_only_pass_naming_the_host_signal(
    gate_runs: dict[str, Path],
) -> None:
    # NEW ran beside the CPU burners, BASE after they were gone.
    status, data = gate_json(gate_runs["quiet"], gate_runs["healthy"], "--fail-above", "10%")
    verdict = data["gate"]
    assert status == PASS and isinstance(verdict, dict), verdict
    assert verdict["grew"] == []
    if verdict["median_shift_ms"] > verdict["bar_ms"]:
        assert verdict["whole_job"] and verdict["machine"]["explained"], verdict
        assert re.search(
            r"; the machine changed \(CPU per wall [\d.]+ -> [\d.]+", verdict["reason"]
        )
    else:
        assert not verdict["whole_job"], verdict


def test_an_even_slowdown_inside_the_noise_on_an_unchanged_machine_passes(tmp_path: Path) -> None:
    # The noisy steps of the test above, 12% slower everywhere, on a machine that did not change.
    noisy = [healthy(i) * (1 + (i % 2) * 0.5) for i in range(2)]
    base = write_run(tmp_path / "base", noisy, host_signals=QUIET_HOST)
    new = write_run(tmp_path / "new", [d * 1.12 for d in noisy[::-1]], host_signals=QUIET_HOST)
    status, data = gate_json(base, new, "--fail-above", "10%")
    verdict = data["gate"]
    assert status == PASS and isinstance(verdict, dict), verdict
    assert verdict["median_shift_ms"] > verdict["bar_ms"] and verdict["whole_job"], verdict
    assert re.search(
        r"inside the steps' noise \(\d+\.\d ms\) also at BASE's CPU per wall second; the machine "
        r"did not change \(CPU per wall 0\.9 -> 0\.9; load 0\.5 -> 0\.5 per CPU;",
        str(verdict["reason"]),
    ), verdict
