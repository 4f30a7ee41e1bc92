"""``stagefrontier run``'s command line, and the automatic hooks in one process: the honest
line for a loop they cannot time and ``python -m stagefrontier.run``.

Cost: each one-process test starts Python on a 12-step loop (about 10 s on a loaded 2-core
machine, torch's import most of it); the rest is instant. The environment switch, as a wheel
and an editable install place it, is tested in test_run_installed.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auto_support import ODD_LOOPS, run_one_process
from stagefrontier.auto.options import AutoOptions, read_env
from stagefrontier.cli import build_parser
from stagefrontier.errors import TimerSettingError
from stagefrontier.launch.command import separate
from stagefrontier.launch.worker import _runs_a_script


def test_own_options_come_first_and_torchrun_keeps_the_rest() -> None:
    words = ["run", "--out", "o", "--router", "--window=5", "--standalone", "t.py", "--out", "x"]
    args = build_parser().parse_args(separate(words))
    assert (args.out, args.router, args.window, args.disable) == ("o", True, 5, False)
    assert args.torchrun == ["--", "--standalone", "t.py", "--out", "x"]
    # other subcommands are left as they are
    assert separate(["report", "--out", "o"]) == ["report", "--out", "o"]


def test_the_script_is_started_through_the_bootstrap() -> None:
    pytest.importorskip("torch")
    from stagefrontier.launch.command import torchrun_args

    line = ["--", "--standalone", "--nproc-per-node", "4", "train.py", "--lr", "1"]
    assert torchrun_args(line) == [
        "--standalone",
        "--nproc-per-node",
        "4",
        "-m",
        "stagefrontier.run",
        "train.py",
        "--lr",
        "1",
    ]
    assert torchrun_args(["-m", "pkg.train", "--x"]) == [
        "-m",
        "stagefrontier.run",
        "-m",
        "pkg.train",
        "--x",
    ]


def test_options_travel_in_the_environment_and_are_checked() -> None:
    options = AutoOptions(out="o", window=7, router=True, sinks=("csv:w.csv",))
    assert read_env(options.env()) == options
    assert read_env(AutoOptions(enabled=False).env()).enabled is False  # --disable
    with pytest.raises(TimerSettingError, match="--window"):
        AutoOptions(window=0)
    with pytest.raises(TimerSettingError, match="one of csv"):
        AutoOptions(sinks=("nope",))
    with pytest.raises(TimerSettingError, match="STAGEFRONTIER_WINDOW"):
        read_env({"STAGEFRONTIER_WINDOW": "ten"})


def test_sink_specs_build_their_sinks(tmp_path: Path) -> None:
    from stagefrontier.auto.options import make_sink
    from stagefrontier.sinks import CsvSink

    sink = make_sink(f"csv:{tmp_path / 'w.csv'}")
    assert isinstance(sink, CsvSink)
    with pytest.raises(TimerSettingError, match="whole number"):
        AutoOptions(sinks=("prometheus:http",))


def test_a_launch_line_torchrun_refuses_is_said_in_one_line() -> None:
    pytest.importorskip("torch")
    from stagefrontier.errors import StageFrontierError
    from stagefrontier.launch.command import torchrun_args

    with pytest.raises(StageFrontierError, match="no SCRIPT given"):
        torchrun_args(["--"])
    with pytest.raises(StageFrontierError, match="torchrun does not accept its options: "):
        torchrun_args(["--nproc-per-node"])
    with pytest.raises(StageFrontierError, match="cannot wrap --no-python"):
        torchrun_args(["--no-python", "train.sh"])


def test_the_switch_installs_only_in_a_worker_running_a_script() -> None:
    assert _runs_a_script(["python", "-u", "train.py"])
    assert _runs_a_script(["python", "-X", "dev", "-m", "pkg.train"])
    assert not _runs_a_script(["python", "-c", "from multiprocessing.spawn import spawn_main"])
    assert not _runs_a_script(["python", "-m", "torch.distributed.run", "train.py"])
    assert not _runs_a_script(["python", "-m", "stagefrontier.run", "train.py"])
    assert not _runs_a_script(["python"])


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("two-optimizers", "2 optimizers step in one training loop (SGD, SGD)"),
        ("no-step", "12 training forward call(s) and no optimizer step: nothing was timed"),
        ("custom-backward", "no backward call seen in the first step (a custom backward?)"),
        ("eval-only", "1000 calls of the outermost module and no training step"),
    ],
)
def test_a_loop_that_does_not_fit_is_said_in_one_line(tmp_path: Path, mode: str, said: str) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "sf"
    env = {"STAGEFRONTIER_OUT": str(out), "STAGEFRONTIER_WINDOW": "5"}
    done = run_one_process(["-m", "stagefrontier.run", str(ODD_LOOPS), mode], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if said in line]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("stagefrontier: ")
    assert f"{mode}: done" in done.stdout
    if mode == "custom-backward":  # timed, the backward inside the forward stage
        records = [json.loads(r) for r in (out / "windows.jsonl").read_text().splitlines()]
        assert [r["n_steps"] for r in records] == [5, 5, 1]  # the first of 12 is not timed
        assert all(r["contract_violations"] == 0 for r in records)
    else:
        assert not (out / "windows.jsonl").exists()


def test_a_timer_turned_off_in_its_settings_stops_the_hooks(tmp_path: Path) -> None:
    """A timer built disabled has nothing to time: the hooks take themselves away when they
    would start timing (the second step), and the loop runs on untouched."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from stagefrontier.auto.driver import OFF, AutoDriver
    from stagefrontier.integrations._timer import TimerArguments

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(6, 4), torch.randn(6, 1)), batch_size=1)
    backward, next_batch = torch.autograd.backward, type(iter(loader)).__next__
    settings = {"enabled": False, "out_dir": str(tmp_path)}
    driver = AutoDriver(TimerArguments("the test's", [], None, settings))
    driver.install()
    steps = 0
    try:
        for x, y in loader:
            steps += 1
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        # gone before the loop ended, not by the stop below
        assert driver.phase == OFF
        assert torch.autograd.backward is backward
        assert type(iter(loader)).__next__ is next_batch
    finally:
        driver.stop()
    assert steps == 6
    assert not (tmp_path / "windows.jsonl").exists()


def test_a_capture_records_the_hooks_data_waits_as_ranges(tmp_path: Path) -> None:
    """While a capture records profiler ranges, a DataLoader fetch under the automatic hooks is
    a ``data.next_wait@step#N`` range of the trace, as under ``timer.iter`` (the router's
    confirmation of a data stall reads them); the hooks' inline timing skipped them."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from stagefrontier import ProfilerRouter
    from stagefrontier.analysis.wait_rule import parse_wait_range
    from stagefrontier.auto.driver import AutoDriver
    from stagefrontier.integrations._timer import TimerArguments

    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(12, 4), torch.randn(12, 1)), batch_size=1)
    driver = AutoDriver(
        TimerArguments("the test's", [], ProfilerRouter(), {"out_dir": str(tmp_path)})
    )
    driver.install()
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    try:
        for _epoch in range(2):  # the hooks learn the loop in the first, time the second
            for step, (x, y) in enumerate(loader):
                if driver.timer is not None and step == 4:  # a capture's ranges from here
                    profiler.start()
                    driver.timer.instrumentation.record_ranges()
                if driver.timer is not None and step == 9:
                    driver.timer.instrumentation.stop_ranges()
                    profiler.stop()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
    finally:
        driver.stop()
    names = [event.name for event in profiler.events()]
    waits = [parse_wait_range(name) for name in names if parse_wait_range(name) is not None]
    assert waits and all(wait[0] == "data.next_wait" for wait in waits if wait), names
