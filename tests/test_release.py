"""The release a user installs: ``python -m build`` makes an sdist and a wheel (the wheel built
from the sdist, so the sdist is complete), both install in a fresh virtual environment without
torch, and the installed command runs: ``--help``, ``--version`` and ``analyze`` on the example
window shipped in the sdist."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import stagefrontier

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/sync_wait_window.npz"
STEP_TIMEOUT_S = 300
# what a user's shell has: nothing that puts the source tree ahead of the installed package
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        env=ENV,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _pip_install(venv_python: Path, *args: str | Path) -> None:
    """pip of this interpreter, installing into the fresh environment (which has no pip)."""
    _run(sys.executable, "-m", "pip", "--python", venv_python, "install", "--quiet", *args)


def _check_installed(venv: Path, example: Path) -> None:
    python = venv / "bin" / "python"
    script = venv / "bin" / "stagefrontier"
    no_torch = subprocess.run(
        [python, "-c", "import torch"], capture_output=True, text=True, env=ENV
    )
    assert "No module named 'torch'" in no_torch.stderr
    assert "analyze" in _run(script, "--help")
    assert _run(script, "--version").strip() == f"stagefrontier {stagefrontier.__version__}"
    report = _run(script, "analyze", example)
    assert "window: 50 steps x 4 ranks x 6 stages" in report
    assert "data.next_wait" in report
    where = _run(python, "-c", "import stagefrontier; print(stagefrontier.__file__)")
    assert Path(where.strip()).is_relative_to(venv), where


@pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import build, hatchling"]).returncode != 0,
    reason="needs the dev extra (build, hatchling)",
)
def test_the_wheel_and_the_sdist_install_without_torch_and_run(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT)
    version = stagefrontier.__version__
    wheel = dist / f"stagefrontier-{version}-py3-none-any.whl"
    sdist = dist / f"stagefrontier-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    with zipfile.ZipFile(wheel) as archive:  # the environment switch, at site-packages' top
        assert "stagefrontier-auto.pth" in archive.namelist()

    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
        top = f"stagefrontier-{version}"
        for shipped in ("README.md", "pyproject.toml", "CHANGELOG.md", EXAMPLE):
            assert f"{top}/{shipped}" in names, f"the sdist lacks {shipped}"
        archive.extract(f"{top}/{EXAMPLE}", tmp_path, filter="data")
    example = tmp_path / top / EXAMPLE

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    _pip_install(venv / "bin" / "python", wheel)
    _check_installed(venv, example)

    # the sdist alone, as pip builds it for a user (isolated build, hatchling from the index)
    _pip_install(venv / "bin" / "python", "--force-reinstall", "--no-deps", sdist)
    _check_installed(venv, example)
