"""``windows.jsonl`` and the run's report when the disk fills and is freed again (issue 37,
items 1 and 3).

The full disk is real: the training process runs under ``RLIMIT_FSIZE``, so a write that takes
a file past the limit is cut short at the limit and the next fails with ``EFBIG``, as a write to
a full disk stops at ``ENOSPC``. Raising the soft limit again is the disk freed.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.cli import main

pytest.importorskip("torch")

TRAIN_THROUGH_A_FULL_DISK = textwrap.dedent("""\
    import logging, resource, sys, threading, time
    from pathlib import Path
    from stagefrontier import CollectConfig, StageTimer

    out = Path(sys.argv[1])
    failed = threading.Event()

    class SinkFailures(logging.Handler):
        def emit(self, record):
            if "sink JsonlSink failed" in record.getMessage():
                failed.set()

    logging.getLogger("stagefrontier").addHandler(SinkFailures())
    timer = StageTimer(window=5, collect=CollectConfig("local", out_dir=out, regression=None))

    def train(windows):
        for _ in range(5 * windows):
            with timer.step():
                with timer.stage("data.next_wait"):
                    time.sleep(0.001)
                with timer.stage("model.fwd_loss_cpu_wall"):
                    time.sleep(0.002)

    def wait_for(done):
        while not done():
            time.sleep(0.01)

    records = out / "windows.jsonl"
    train(3)
    wait_for(lambda: records.exists() and records.read_bytes().count(b"\\n") == 3)
    limit = records.stat().st_size + 100  # the next record is cut short 100 bytes in
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    train(1)
    wait_for(failed.is_set)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    train(2)
    timer.close()
""")


@pytest.fixture(scope="module")
def full_disk_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose window 3 met a full disk: its record and packet were cut short."""
    out = tmp_path_factory.mktemp("full-disk")
    _train_in_a_process(TRAIN_THROUGH_A_FULL_DISK, out)
    return out


def _train_in_a_process(script: str, out: Path) -> str:
    """Run ``script`` with ``out`` as its argument; it must end cleanly. Returns its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def test_a_record_cut_by_a_full_disk_is_cut_off_before_the_next_one(full_disk_run: Path) -> None:
    """Before: the cut record stayed and window 4's record was appended onto it, and
    ``report`` refused the whole run ("windows.jsonl:4: not JSON")."""
    lines = (full_disk_run / "windows.jsonl").read_bytes().splitlines()
    assert [json.loads(line)["window"] for line in lines] == [0, 1, 2, 4, 5]


def test_report_reads_a_record_an_older_writer_left_torn_and_says_so(
    full_disk_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: Any
) -> None:
    """A file an older writer left: window 3's record cut short and window 4's run onto it on
    the same line. The cut record is skipped with a warning naming the line; the rest is read."""
    lines = (full_disk_run / "windows.jsonl").read_bytes().splitlines(keepends=True)
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "packets").symlink_to(full_disk_run / "packets")
    (torn / "windows.jsonl").write_bytes(b"".join([*lines[:3], lines[3][:300], *lines[3:]]))
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        code = main(["report", str(torn)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "windows.jsonl:4: a record cut short" in caplog.text
    assert "5 window(s)" in out


def test_report_names_the_windows_a_full_disk_lost(
    full_disk_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Window 3 met the full disk: its record was cut off. Before: "5 window(s)" listing windows
    0, 1, 2, 4 and 5 without a word about window 3."""
    lost = "1 window(s) are missing, neither in windows.jsonl nor in packets/ (3: lost"
    for argv in (["report"], ["report", "--html", str(tmp_path / "run.html")], ["plot"]):
        code = main([*argv, str(full_disk_run)])
        err = capsys.readouterr().err
        assert code == 0, err
        assert lost in err, (argv, err)


@pytest.fixture(scope="module")
def packet_lost(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder of four windows whose packet of window 1 is gone (its record is there)."""
    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.sinks import PacketSink

    out = tmp_path_factory.mktemp("packet-lost")
    sinks = (PacketSink(out),)  # after windows.jsonl, as under distributed collection
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig("local", out_dir=out, regression=None, log=False, sinks=sinks),
        )
    )
    for _ in range(20):
        with timer.step():
            with timer.stage("data.next_wait"):
                sum(range(2000))
            with timer.stage("model.fwd_loss_cpu_wall"):
                sum(range(4000))
    timer.close()
    (out / "packets" / "window-000001.json").unlink()
    return out


def test_a_window_without_a_packet_is_reported_from_its_record_and_said(
    packet_lost: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``report`` and ``report --html`` showed 3 windows (0, 2, 3) and ``compare`` took
    3, none of them saying window 1 had no packet."""
    said = "1 window(s) of windows.jsonl have no packet (1: not written"
    code = main(["report", str(packet_lost)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert said in err
    assert "4 window(s), steps 0-19" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("       ")] == [
        "0",
        "1",
        "2",
        "3",
    ]
    assert f"({said}" in out  # beside the shares the baselines were computed from
    page = tmp_path / "run.html"
    assert main(["report", "--html", str(page), str(packet_lost)]) == 0
    assert said in capsys.readouterr().err
    assert said in page.read_text()
    assert main(["compare", str(packet_lost), f"{packet_lost}:0-2"]) == 0
    err = capsys.readouterr().err
    assert f"{packet_lost}: {said}" in err
    assert f"{packet_lost}:0-2: {said}" in err


FULL_TO_THE_END = textwrap.dedent("""\
    import logging, resource, sys, time
    from pathlib import Path
    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.sinks import PacketSink

    logging.basicConfig(format="%(message)s")  # the application shows warnings on stderr
    out = Path(sys.argv[1])
    sinks = (PacketSink(out),)
    collect = CollectConfig("local", out_dir=out, regression=None, sinks=sinks)
    timer = StageTimer(config=TimerConfig(window=5, collection=collect))
    for step in range(30):
        if step == 5:
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
        with timer.step():
            with timer.stage("data.next_wait"):
                time.sleep(0.001)
    timer.close()
""")


def test_a_disk_full_to_the_end_is_said_once_per_sink(tmp_path: Path) -> None:
    """Item 12: before, every window logged a failure from each sink (28 lines for 7 windows)."""
    stderr = _train_in_a_process(FULL_TO_THE_END, tmp_path)
    failed = [line for line in stderr.splitlines() if "failed" in line]
    assert sorted(line.split(" failed")[0] for line in failed) == [
        "stagefrontier: writing to sink JsonlSink",
        "stagefrontier: writing to sink PacketSink",
    ], stderr
