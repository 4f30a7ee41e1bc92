"""The ``stagefrontier`` command: analyze, validate, --version, errors, running without torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from cli_support import console_script
from stagefrontier.cli import main
from stagefrontier.formats.packet import Packet, write_packet
from test_validation import KEYS as VALIDATION_KEYS

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sync_wait_window.npz"
STAGES = sf.DEFAULT_STAGES


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def small_window(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005]) * (
        1 + 0.02 * rng.standard_normal((12, 4, 6))
    )
    d[:, 1, 0] += 0.2  # rank 1 stalls in data, nobody waits for it
    return d


# --- analyze ------------------------------------------------------------------------------------


def test_analyze_example_prints_a_readable_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["analyze", str(EXAMPLE)], capsys)
    assert code == 0 and err == ""
    header = next(line for line in out.splitlines() if line.startswith("stage "))
    assert header.split() == ["stage", "share", "advance", "s", "direct", "gain", "leader"]
    data_row = next(line for line in out.splitlines() if line.startswith("data.next_wait "))
    assert data_row.split()[-1] == "2"  # rank 2 leads the data boundary
    assert "top-1: data.next_wait" in out
    assert "routing set (candidate_threshold=0.8): data.next_wait, model.backward_cpu_wall" in out
    assert "co-critical stages: data.next_wait, model.backward_cpu_wall" in out
    assert "\n  co_critical\n    - data.next_wait leads with" in out


def test_analyze_json_is_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["analyze", str(EXAMPLE), "--json"], capsys)
    assert code == 0
    with np.load(EXAMPLE) as npz:
        expected = sf.analyze(npz["d"], [str(s) for s in npz["stages"]])
    assert sf.WindowReport.from_json(out) == expected
    assert expected.top1 == "data.next_wait"


def test_example_file_is_what_the_script_generates() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_example", ROOT / "examples/make_sync_wait_window.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    regenerated = module.make_window(np.random.default_rng(module.SEED))
    with np.load(EXAMPLE) as npz:
        assert npz["d"].tobytes() == regenerated.tobytes()
        assert tuple(npz["stages"].tolist()) == STAGES


def test_analyze_npz_with_roles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.npz"
    np.savez(
        path,
        d=small_window(),
        stages=np.array(STAGES),
        roles=np.array(["pp0", "pp0", "pp1", "pp1"]),
    )
    code, out, _ = run(["analyze", str(path), "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert "role_aware_needed" in report["labels"]
    assert report["roles"] == ["pp0", "pp0", "pp1", "pp1"]


def test_analyze_packet_gives_the_stored_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = small_window()
    side = sf.SideEvidence(missing_ranks=(3,), gather_ok=False)
    report = sf.analyze(d, STAGES, side=side)
    meta = {"window": 4, "world_size": 5}
    # No extension: the kind is told by content.
    path = write_packet(tmp_path / "window-4", Packet.of_window(d, report, side=side, meta=meta))
    code, out, err = run(["analyze", str(path), "--json"], capsys)
    assert code == 0 and err == ""
    assert sf.WindowReport.from_json(out) == report
    code, out, _ = run(["analyze", str(path)], capsys)
    assert code == 0
    assert "meta: window=4, world_size=5" in out
    assert "telemetry_limited" in out and "missing ranks [3]" in out


def test_analyze_undefined_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "zeros.npz"
    np.savez(path, d=np.zeros((2, 2, 6)), stages=np.array(STAGES))
    code, out, _ = run(["analyze", str(path)], capsys)
    assert code == 0
    assert "shares undefined" in out and "n/a" in out


# --- errors -------------------------------------------------------------------------------------


def assert_one_line_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("stagefrontier: error: ")
    assert needle in err
    assert "Traceback" not in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["analyze", str(tmp_path / "nope.npz")], capsys)
    assert_one_line_error(code, out, err, "No such file or directory")


def _nan_window() -> np.ndarray:
    d = small_window()
    d[3, 2, 1] = np.nan
    return d


def _npy(path: Path) -> None:
    with path.open("wb") as handle:
        np.save(handle, small_window())


BAD_FILES: dict[str, tuple[str, Callable[[Path], object], str]] = {
    # name: (file name, what writes it, what the one-line error says)
    "corrupt_packet": (
        "p.json",
        lambda p: p.write_text('{"format": "stagefrontier.formats.packet", "version": 99}'),
        "unknown packet version 99",
    ),
    "npz_without_d": (
        "w.npz",
        lambda p: np.savez(p, stages=np.array(STAGES)),
        "has no 'd' array",
    ),
    "npz_with_bad_durations": (
        "w.npz",
        lambda p: np.savez(p, d=_nan_window(), stages=np.array(STAGES)),
        "1 NaN duration(s); first at step 3, rank 2, stage 1",
    ),
    "npz_with_pickled_objects": (
        "w.npz",
        lambda p: np.savez(p, d=small_window(), stages=np.array(list(STAGES), dtype=object)),
        "not a readable .npz window",
    ),
    "single_npy_array": ("w.npz", _npy, "a single .npy array, not an .npz window"),
    "unrecognized_file": (
        "notes.txt",
        lambda p: p.write_text("hello"),
        "neither an .npz window nor a stagefrontier packet",
    ),
    "stage_count_mismatch": (
        "w.npz",
        lambda p: np.savez(p, d=small_window(), stages=np.array(STAGES[:5])),
        "5 stage names given but the matrix has 6 stages",
    ),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_a_bad_input_file_is_refused_in_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file_name, write, needle = BAD_FILES[name]
    path = tmp_path / file_name
    write(path)
    code, out, err = run(["analyze", str(path)], capsys)
    assert_one_line_error(code, out, err, needle)


def test_version_and_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"stagefrontier {sf.__version__}"
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


# --- validate -----------------------------------------------------------------------------------


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["validate", "--json"], capsys)
    assert code == 0
    result: dict[str, Any] = json.loads(out)
    assert set(result) == VALIDATION_KEYS
    assert result["telescoping_max_error"] < 1e-12
    assert result["bound_violations"] == 0
    assert result["stability_max_ratio"] <= 1.0
    assert result["sync_wait_recovery"] == {
        "stagefrontier": 1.0,
        "per_stage_max": 0.0,
        "per_stage_mean": 0.0,
    }
    assert result["direct_exposure_recovery"] == 1.0
    assert result["downgrade_fixtures"] == {
        "co_critical": True,
        "role_heterogeneous": True,
        "telemetry_limited": True,
        "two_stage_tie": True,
    }
    assert result["ok"] is True


def test_validate_failure_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = {
        "telescoping_max_error": 1e-16,
        "bound_violations": 3,
        "stability_max_ratio": 0.5,
        "sync_wait_recovery": {"stagefrontier": 1.0, "per_stage_max": 0.0, "per_stage_mean": 0.0},
        "direct_exposure_recovery": 1.0,
        "downgrade_fixtures": {"co_critical": True},
        "ok": False,
    }
    monkeypatch.setattr("stagefrontier.cli.window_commands.run_validation", lambda: failing)
    code, out, _ = run(["validate"], capsys)
    assert code == 1
    rows = {line.split("  ")[0]: line.split()[-1] for line in out.splitlines()[1:-1]}
    assert rows["bound violations"] == "FAIL"
    assert rows["telescoping max error"] == "PASS"
    assert out.splitlines()[-1] == "SOME CHECKS FAILED"


def test_console_script_validate() -> None:
    proc = subprocess.run(
        [*console_script(), "validate"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "all checks pass"
    assert len(lines) == 13  # header, 11 checks, verdict
    assert all(line.endswith("PASS") for line in lines[1:-1])


# --- torch absent -------------------------------------------------------------------------------


def test_a_reader_that_stops_early_is_no_error() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` after its line: every write now fails
    try:
        proc = subprocess.run(
            [*console_script(), "analyze", str(EXAMPLE)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 0 and proc.stderr == ""


def test_cli_runs_with_torch_absent() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from stagefrontier.cli import main\n"
        f"sys.exit(main(['analyze', {str(EXAMPLE)!r}, '--json']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["top1"] == "data.next_wait"


def test_analyze_a_window_of_a_single_process_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A one-process run writes windows.jsonl and no packets/: --window reads its record."""
    out = tmp_path / "run"
    with sf.StageTimer(
        config=sf.TimerConfig(window=2, collection=sf.CollectConfig(out_dir=str(out), log=False))
    ) as timer:
        for _ in range(6):
            with timer.step(), timer.stage(sf.DATA_STAGE):
                pass
    assert not (out / "packets").exists()
    code, stdout, stderr = run(["analyze", str(out), "--window", "1"], capsys)
    assert code == 0, stderr
    assert "window=1, first_step=2, last_step=3" in stdout
