"""A trace export that meets a full disk, and temporary files an interrupted write left behind
(issue 23, item 16).

The full disk is real: the capturing process runs under ``RLIMIT_FSIZE``, so every write that
would take a file past the limit fails with ``EFBIG`` in the kernel, as a write to a full disk
fails with ``ENOSPC`` (Python ignores ``SIGXFSZ``, so the write fails instead of killing the
process). The profiler, Kineto's JSON writer and the gzip step all run as in training.
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD
from stagefrontier.demo.launch import run_ranks
from stagefrontier.formats.incident import read_incident
from trace_support import manual_incident

FILE_LIMIT = 256 * 1024
"""Bytes a file of the capturing process may reach once the capture is asked for: the
incident's files and ``windows.jsonl`` (under 100 kB each here) fit, the profiler's JSON trace
of this model's steps with every operator recorded (``record_ops=True``: megabytes) does not. A
capture of the ranges alone, the router's default, is a few kB and would fit."""
LAYERS = 20


def _train(timer: object, steps: int) -> None:
    import torch

    model = torch.nn.Linear(8, 8)
    for _ in range(steps):
        with timer.step():  # type: ignore[attr-defined]
            with timer.stage("data.next_wait"):  # type: ignore[attr-defined]
                time.sleep(0.02)
            with timer.stage("model.fwd_loss_cpu_wall"):  # type: ignore[attr-defined]
                x = torch.randn(4, 8)
                for _ in range(LAYERS):
                    x = model(x)
                x.sum().backward()


def _capture_on_a_full_disk(rank: int, out_dir: str, port: int) -> None:
    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    store = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=60))
    router = ProfilerRouter(steps=3, store=store, capture_timeout_s=120.0, record_ops=True)
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig("local", out_dir=out_dir, regression=None, log=False),
            router=router,
        )
    )
    _train(timer, 5)  # one window: the step time is known
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, resource.RLIM_INFINITY))
    router.request_capture([0])
    _train(timer, 40)
    timer.close()


def test_a_trace_export_on_a_full_disk_leaves_no_partial_file_and_says_why(
    tmp_path: Path,
) -> None:
    codes = run_ranks(
        _capture_on_a_full_disk, 1, str(tmp_path), deadline_s=300.0, start_method=START_METHOD
    )
    assert codes == {0: 0}
    folder = manual_incident(tmp_path)
    incident = read_incident(folder)
    assert not incident["captured"]
    failed = [r for r in incident["reasons"] if r.startswith("rank 0 failed: ")]
    assert len(failed) == 1, incident["reasons"]
    assert "trace export failed" in failed[0] and "nothing was kept" in failed[0], failed
    assert sorted(p.name for p in folder.iterdir()) == [
        "incident.html",
        "incident.json",
        "incident.md",
    ]


def test_a_compressed_trace_cut_by_a_full_disk_leaves_no_partial_file(tmp_path: Path) -> None:
    """The other half of the export: Kineto's JSON fitted, its compressed copy does not. The
    gzip step runs in a process whose files may not pass 4 kB; before, it wrote straight into
    ``rank0.pt.trace.json.gz`` and left it cut short there."""
    source = tmp_path / "plain.json"
    source.write_text(
        '{"traceEvents": [' + ",".join(f'"{os.urandom(32).hex()}"' for _ in range(8000)) + "]}"
    )
    target = tmp_path / "rank0.pt.trace.json.gz"
    script = textwrap.dedent("""\
        import sys
        from pathlib import Path
        from stagefrontier.route.trace_parts import GzipTarget
        zipped = GzipTarget(Path(sys.argv[2]))
        try:
            zipped.write(Path(sys.argv[1]).read_bytes())
            zipped.commit()
        except OSError as exc:
            zipped.discard()
            print(exc.errno)
    """)
    done = _in_limited_process(script, str(source), str(target), limit=4096)
    assert done.stdout.strip() == str(errno.EFBIG), (done.stdout, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.json"]


def _in_limited_process(script: str, *args: str, limit: int) -> subprocess.CompletedProcess[str]:
    """``python -c script args`` in a process whose files may not grow past ``limit`` bytes;
    the process must exit cleanly."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_files,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_an_incident_write_on_a_full_disk_keeps_the_previous_file(tmp_path: Path) -> None:
    """``incident.json``, ``incident.md`` and ``incident.html`` are replaced whole or not at
    all: a write that fails part way keeps the previous files and leaves no temporary one."""
    from stagefrontier.formats.incident import new_incident
    from stagefrontier.render.incident import write_incident
    from stagefrontier.route.html import write_html

    folder = tmp_path / "incidents" / "w00003"
    write_incident(folder, new_incident("w00003", "window"))
    write_html(folder, new_incident("w00003", "window"), tmp_path, figures=False)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    script = textwrap.dedent("""\
        import sys
        from stagefrontier.formats.incident import new_incident
        from stagefrontier.render.incident import write_incident
        from stagefrontier.route.html import write_html
        incident = new_incident('w00003', 'window')
        incident['reasons'] = ['a reason that takes room ' * 100] * 50
        folder, run = sys.argv[1:]
        for write in (write_incident, lambda f, i: write_html(f, i, run, figures=False)):
            try:
                write(folder, incident)
            except OSError as exc:
                print(exc.errno)
    """)
    done = _in_limited_process(script, str(folder), str(tmp_path), limit=8192)
    assert done.stdout.split() == [str(errno.EFBIG)] * 2, (done.stdout, done.stderr)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_temporary_files_an_interrupted_write_left_are_removed_by_the_next_run(
    tmp_path: Path,
) -> None:
    """A process killed while it wrote (a packet, an incident, a trace) leaves its temporary
    file; the next run on the folder removes them before it writes there, and nothing else."""
    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.formats.incident import new_incident
    from stagefrontier.render.incident import write_incident
    from stagefrontier.sinks.files import PacketSink

    packets = tmp_path / "packets"
    incident = tmp_path / "incidents" / "w00005"
    write_incident(incident, new_incident("w00005", "window"))
    packets.mkdir()
    (packets / "notes.tmp").write_text("the user's own file")  # not hidden: no packet write's
    kept = [packets / "notes.tmp", *incident.iterdir()]
    left = [
        packets / ".window-000003.json.5f0c1d2e3a4b.tmp",
        incident / ".rank0.pt.trace.json.gz.0a1b2c3d4e5f.tmp",  # the gzip step's
        incident / ".rank0.pt.trace.json.gz.0a1b2c3d4e5f.json.tmp.tmp",  # Kineto's own
        incident / ".incident.json.9e8d7c6b5a4f.tmp",
        incident / "incident.json.tmp",  # the name an earlier version wrote through
    ]
    for path in left:
        path.write_bytes(b'{"cut short')
    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    router = ProfilerRouter(store=store, max_captures=0)
    timer = StageTimer(  # packets as rank 0 writes them under distributed collection
        config=TimerConfig(
            window=5,
            collection=CollectConfig(
                "local", out_dir=tmp_path, regression=None, log=False, sinks=(PacketSink(tmp_path),)
            ),
            router=router,
        )
    )
    _train(timer, 10)
    timer.close()
    assert [p.name for p in left if p.exists()] == []
    assert [p.name for p in kept if not p.exists()] == []
    assert sorted(p.name for p in packets.glob("window-*.json")) == [
        "window-000000.json",
        "window-000001.json",
    ]
