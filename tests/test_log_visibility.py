"""The library installs no log handler: a script that configured no logging sees nothing on
stderr (its logger holds a ``NullHandler`` only); a script that did sees each window line once,
in its own format; ``log=False`` leaves the line out. The command line and the demo configure
logging themselves (``test_cli.py``, ``test_demo.py`` check what they print).

Each case runs in a fresh interpreter: pytest itself gives the root logger handlers, so the
"nothing configured" case only exists outside it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from source_support import source_nodes

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
    if case == "unconfigured":
        logging.getLogger("stagefrontier").warning("a warning nobody configured")
        held = logging.getLogger("stagefrontier").handlers + logging.root.handlers
        print(" ".join(type(h).__name__ for h in held))
    if case == "configured_later":
        logging.basicConfig(level=logging.WARNING, format="app %(name)s %(message)s")
        logging.getLogger("stagefrontier").warning("a warning after configuring")
        run(out + "/second")
    """
)


def _run(case: str, tmp_path: Path) -> tuple[str, list[str]]:
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
    return proc.stdout, proc.stderr.splitlines()


def _stderr(case: str, tmp_path: Path) -> list[str]:
    stdout, stderr = _run(case, tmp_path)
    assert stdout == ""
    return stderr


def _window_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "window " in line and " steps " in line]


def test_nothing_reaches_stderr_when_nothing_is_configured(tmp_path: Path) -> None:
    stdout, stderr = _run("unconfigured", tmp_path)
    assert stdout == "NullHandler\n"  # the only handler, on the library's logger; root has none
    assert [line for line in stderr if "stagefrontier" in line or "nobody" in line] == []
    assert (tmp_path / "first" / "windows.jsonl").read_text().count("\n") == 2


def test_no_module_of_the_library_adds_a_handler() -> None:
    """Only ``logs.py`` holds the handler an application asks for (``show_on_stderr``), and
    only the command line, the demo and ``stagefrontier run``'s worker bootstrap ask for it."""
    adders, callers = set(), set()
    for module, node in source_nodes():
        if isinstance(node, ast.Attribute) and node.attr in ("addHandler", "basicConfig"):
            adders.add(module)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("show_on_stderr", "shown_on_stderr"):
                callers.add(module)
    # __init__.py: the NullHandler; demo/train.py: the demo's basicConfig
    assert adders == {"__init__.py", "logs.py", "demo/train.py"}
    # logs.py: the context manager; launch/worker.py: the bootstrap that runs an unmodified
    # script under stagefrontier run, an application entry like the command line
    assert callers == {"logs.py", "cli/main.py", "demo/train.py", "launch/worker.py"}


def test_configured_logging_shows_each_line_once_in_its_own_format(tmp_path: Path) -> None:
    lines = _window_lines(_stderr("configured", tmp_path))
    assert len(lines) == 2
    assert lines[0].startswith("app stagefrontier window 0 steps 0-1 | ")
    assert lines[1].startswith("app stagefrontier window 1 steps 2-3 | ")


def test_logging_configured_later_decides_alone(tmp_path: Path) -> None:
    """Before the script configures logging nothing is shown; once it configures WARNING, its
    level decides: the second timer's INFO lines are not shown, and the warning is shown once,
    in the script's format."""
    lines = _stderr("configured_later", tmp_path)
    assert _window_lines(lines) == []
    assert [line for line in lines if "after configuring" in line] == [
        "app stagefrontier a warning after configuring"
    ]


def test_log_false_leaves_the_line_out(tmp_path: Path) -> None:
    assert _window_lines(_stderr("off", tmp_path)) == []
    assert (tmp_path / "first" / "windows.jsonl").read_text().count("\n") == 2
