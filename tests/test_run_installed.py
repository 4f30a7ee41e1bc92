"""The environment switch (``STAGEFRONTIER_AUTO=1``) as a user installs the package: ``pip install``
(a wheel) and ``pip install -e`` (editable). Both put ``stagefrontier-auto.pth`` into
site-packages; the editable install adds a path file reaching this checkout's sources, which
Python reads first (path files run in name order, and its name starts with ``_``), so the
switch's line finds the package in both.

Each install goes into a fresh virtual environment made without pip, built by pip as it builds
for a user (an isolated build: hatchling, and for the editable install the ``editables``
package, from the index); torch and the other dependencies come from the running interpreter's
site-packages through one more path file. Nothing puts the source tree on ``PYTHONPATH``.

Cost: per install, one pip build (10 to 40 s on a loaded 2-core machine), one run of a 12-step
loop in one process (about 10 s, torch's import most of it) and one 11-step torchrun job of 2
Gloo ranks (about 15 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from auto_support import DEADLINE_S, ODD_LOOPS, ROOT

pytest.importorskip("torch")

INSTALLS = {"wheel": (), "editable": ("-e",)}
"""pip's arguments before the checkout, per install."""
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
ENV["OMP_NUM_THREADS"] = "1"


def _python(python: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``python ARGS`` with what a user's shell has (and ``env``); its stdout."""
    done = subprocess.run(
        [str(python), *args],
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module", params=list(INSTALLS))
def installed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with this checkout installed the way the parameter names;
    returns its Python."""
    venv = tmp_path_factory.mktemp(request.param) / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = ("-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps")
    _python(Path(sys.executable), *pip, *INSTALLS[request.param], str(ROOT))
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_python(python, "-c", purelib).strip())
    assert (site / "stagefrontier-auto.pth").is_file(), sorted(p.name for p in site.iterdir())
    (site / "_dependencies.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    return python


def test_the_package_comes_from_its_install_and_the_line_only_reads_the_switch(
    installed: Path,
) -> None:
    where = _python(installed, "-c", "import stagefrontier; print(stagefrontier.__file__)")
    editable = installed.parents[2].name.startswith("editable")
    home = ROOT / "src" if editable else installed.parents[1]
    assert Path(where.strip()).is_relative_to(home), where
    # without the switch, the installed line imports nothing of StageFrontier in a worker
    imported = "import sys; print(sorted(m for m in sys.modules if 'stagefrontier' in m))"
    assert _python(installed, "-c", imported, env={"RANK": "0"}).strip() == "[]"


def test_the_switch_times_a_script_started_as_it_is(installed: Path, tmp_path: Path) -> None:
    """``STAGEFRONTIER_AUTO=1 python train.py`` in a worker (``RANK`` set), as under srun: the
    installed ``.pth`` line times the script."""
    out = tmp_path / "sf"
    env = {"RANK": "0", "STAGEFRONTIER_OUT": str(out), "STAGEFRONTIER_WINDOW": "5"}
    said = _python(installed, str(ODD_LOOPS), "plain", env={**env, "STAGEFRONTIER_AUTO": "1"})
    assert "plain: done" in said
    records = [json.loads(r) for r in (out / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5, 1]  # the first of 12 is watched
    assert records[0]["stages"] == [
        "data.next_wait",
        "model.fwd_loss_cpu_wall",
        "model.backward_cpu_wall",
        "optim.step_cpu_wall",
        "step.other_cpu_wall",
    ]
    assert all(r["contract_violations"] == 0 for r in records)


def test_the_switch_times_every_worker_of_a_plain_torchrun(installed: Path, tmp_path: Path) -> None:
    """``STAGEFRONTIER_AUTO=1 torchrun --standalone --nproc-per-node 2 train_ddp.py``: torchrun
    left as it is (a launcher the user cannot prefix), 2 Gloo ranks; the installed line times
    both workers and rank 0 gathers their windows."""
    out = tmp_path / "sf"
    env = {"STAGEFRONTIER_AUTO": "1", "STAGEFRONTIER_OUT": str(out), "STAGEFRONTIER_WINDOW": "5"}
    torchrun = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    script = (str(ROOT / "examples" / "unmodified" / "train_ddp.py"), "--steps", "11")
    _python(installed, *torchrun, "--max-restarts=0", *script, env=env)
    records = [json.loads(r) for r in (out / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5]  # the first of 11 is watched
    assert all(r["n_ranks"] == 2 and r["gather_ok"] for r in records)
    assert all(r["contract_violations"] == 0 for r in records)
