"""Rank 0's window line reaches stderr in a script that configured no logging, exactly once in a
script that did, and not at all with ``log=False``.

Each case runs in a fresh interpreter: pytest itself gives the root logger handlers, so the
"nothing configured" case only exists outside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import logging
    import sys

    from stagefrontier import StageTimer

    case, out = sys.argv[1], sys.argv[2]


    def run(out_dir, **kwargs):
        timer = StageTimer(window=2, out_dir=out_dir, collect="local", **kwargs)
        for _ in range(4):
            with timer.step(), timer.stage("model.fwd_loss_cpu_wall"):
                pass
        timer.close()  # waits for the analysis thread: both lines are written by now


    if case == "configured":
        logging.basicConfig(level=logging.INFO, format="app %(name)s %(message)s")
    run(out + "/first", log=case != "off")
    if case == "configured_later":
        logging.basicConfig(level=logging.WARNING, format="app %(name)s %(message)s")
        logging.getLogger("stagefrontier").warning("a warning after configuring")
        run(out + "/second")
    """
)


def _stderr(case: str, tmp_path: Path) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, case, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    return proc.stderr.splitlines()


def _window_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "window " in line and " steps " in line]


def test_window_lines_reach_stderr_when_nothing_is_configured(tmp_path: Path) -> None:
    lines = _window_lines(_stderr("unconfigured", tmp_path))
    assert len(lines) == 2
    assert lines[0].startswith("stagefrontier: window 0 steps 0-1 | ")
    assert lines[1].startswith("stagefrontier: window 1 steps 2-3 | ")


def test_configured_logging_shows_each_line_once_in_its_own_format(tmp_path: Path) -> None:
    lines = _window_lines(_stderr("configured", tmp_path))
    assert len(lines) == 2
    assert lines[0].startswith("app stagefrontier window 0 steps 0-1 | ")
    assert lines[1].startswith("app stagefrontier window 1 steps 2-3 | ")


def test_logging_configured_after_the_first_line_takes_over(tmp_path: Path) -> None:
    """The fallback shows the first timer's lines; once the script configures logging at
    WARNING, its level decides: the second timer's INFO lines are not shown, and the warning
    is shown once, in the script's format."""
    lines = _stderr("configured_later", tmp_path)
    assert [line.split(" | ")[0] for line in _window_lines(lines)] == [
        "stagefrontier: window 0 steps 0-1",
        "stagefrontier: window 1 steps 2-3",
    ]
    assert [line for line in lines if "after configuring" in line] == [
        "app stagefrontier a warning after configuring"
    ]


def test_log_false_leaves_the_line_out(tmp_path: Path) -> None:
    assert _window_lines(_stderr("off", tmp_path)) == []
    assert (tmp_path / "first" / "windows.jsonl").read_text().count("\n") == 2
