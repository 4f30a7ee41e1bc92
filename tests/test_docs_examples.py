"""Every Python example in the README and the documentation runs.

Each fenced ``python`` block of ``README.md`` and ``docs/*.md`` is executed on its own, in a fresh
namespace, in an empty working folder. A block may use names it does not define only when they
are in ``EXAMPLE_NAMES`` below (a tiny real model, an optimizer, an iterator of batches, a
timer, a run folder made by a real ``StageTimer``, a real profiler trace); any other free name
fails the test with the block's file and line. A block that is a snippet include
(``--8<-- "path:section"``) shows code from a module that other tests run: here the section
must exist. Every ``StageTimer`` a block built is closed afterwards. A block that still builds
one with the deprecated flat keywords fails (the pages show ``TimerConfig``).

To add an example to a page: write it so that it runs, with the names above if it needs a
model or a loop, and run this file.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"$')
DEPRECATED_KEYWORDS = "StageTimer's keywords are deprecated"


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _examples() -> list[Example]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2  # the first line of code
            found.append(Example(page, line, match.group(1)))
    return found


EXAMPLES = _examples()


# --- the names an example may use without defining them --------------------------------------


class _Output(dict[str, Any]):
    """A model output both ways: ``out.loss`` (a plain loop) and ``out["loss"]`` (HF Trainer)."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


def _model(_: Path) -> Any:
    import torch

    class TinyModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 1)

        def forward(self, x: Any = None, **_: Any) -> _Output:
            return _Output(loss=self.linear(x).square().mean())

    torch.manual_seed(0)
    return TinyModel()


def _batches() -> Iterator[Any]:
    import torch

    while True:
        time.sleep(0.001)
        yield torch.randn(4, 8)


def _timer(folder: Path) -> Any:
    import stagefrontier

    collection = stagefrontier.CollectConfig(out_dir=str(folder / "timer-out"), log=False)
    return stagefrontier.StageTimer(
        config=stagefrontier.TimerConfig(window=2, collection=collection)
    )


def _demo_folder(folder: Path) -> Path:
    """An output folder like the demo's (five windows of 20 steps, packets included), written by
    a real ``StageTimer`` in this process, with a slow data stage."""
    import stagefrontier
    from stagefrontier.sinks import PacketSink

    out = folder / "stagefrontier-demo"
    sinks = [PacketSink(out)]  # a one-process run writes no packets by default
    collection = stagefrontier.CollectConfig(out_dir=str(out), log=False, sinks=sinks)
    config = stagefrontier.TimerConfig(window=20, collection=collection)
    with stagefrontier.StageTimer(config=config) as timer:
        for _ in range(100):
            with timer.step():
                with timer.stage(stagefrontier.DATA_STAGE):
                    time.sleep(0.002)
                with timer.stage(stagefrontier.FORWARD_STAGE):
                    time.sleep(0.0005)
    return out


def _profiler_folder(folder: Path) -> Path:
    """``log/profiler`` holding a real PyTorch Profiler trace of a few steps (a committed one)."""
    from trace_support import trace

    out = folder / "log" / "profiler"
    out.mkdir(parents=True)
    shutil.copy(trace("slow-data-4-steps.json"), out / "rank0.pt.trace.json")
    return out


def _hf_dataset(_: Path) -> Any:
    import torch

    return [{"x": torch.randn(8)} for _ in range(8)]


EXAMPLE_NAMES: dict[str, Callable[[Path], Any]] = {
    "num_steps": lambda _: 6,
    "accumulation": lambda _: 2,
    "data_iter": lambda _: _batches(),
    "loader": lambda _: [b for b, _ in zip(_batches(), range(6), strict=False)],
    "model": _model,
    "optimizer": lambda _: None,  # replaced by an optimizer over the model's parameters
    "run_callbacks": lambda _: lambda: None,
    "timer": _timer,
    "ds": _hf_dataset,
}
"""Factories, each given the example's working folder."""

FILES: dict[str, Callable[[Path], Path]] = {
    "stagefrontier-demo": _demo_folder,
    "log/profiler": _profiler_folder,
}
"""Inputs an example reads by path: made in the working folder when its code names them."""

NEEDS_PROCESS_GROUP = ('collect="hierarchical"', 'mode="hierarchical"')
"""Code that runs only after ``init_process_group``: such an example runs in a real one-rank Gloo
process group on a loopback store."""


@contextlib.contextmanager
def _process_group(code: str) -> Iterator[None]:
    if not any(marker in code for marker in NEEDS_PROCESS_GROUP):
        yield
        return
    import torch.distributed as dist

    from stagefrontier.collect.node_store import loopback_store

    dist.init_process_group("gloo", store=loopback_store(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _free_names(code: str) -> set[str]:
    """Names the code loads without binding them itself (imports, assignments, loops, ...)."""
    tree = ast.parse(code)
    bound: set[str] = set()
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound - set(dir(builtins))


def _namespace(example: Example, folder: Path) -> dict[str, Any]:
    free = _free_names(example.code)
    unknown = sorted(free - EXAMPLE_NAMES.keys())
    assert not unknown, (
        f"{example.name} uses {unknown} without defining them: define them in the example "
        "or add them to EXAMPLE_NAMES in tests/test_docs_examples.py"
    )
    namespace: dict[str, Any] = {"__name__": "__docs_example__"}
    for name in sorted(free):
        namespace[name] = EXAMPLE_NAMES[name](folder)
    if "optimizer" in free:
        import torch

        model = namespace.get("model") or _model(folder)
        namespace["model"] = model
        namespace["optimizer"] = torch.optim.SGD(model.parameters(), lr=0.01)
    for path, make in FILES.items():
        if f'"{path}' in example.code:
            make(folder)
    return namespace


@contextlib.contextmanager
def _otlp_receiver(code: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For an example with the OpenTelemetry sink: a real OTLP/HTTP receiver on loopback, named
    by the standard variable, and at least one export of the example's windows must reach it."""
    if "OtelSink" not in code:
        yield
        return
    from otlp_support import Receiver

    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url.removesuffix("/v1/metrics"))
    try:
        yield
        _close_timers()
        assert receiver.requests, "the example's OpenTelemetry sink exported nothing"
    finally:
        receiver.close()


def _close_timers() -> None:
    """Close every timer still alive, the ones a block rebound included (closing twice is safe)."""
    import gc

    from stagefrontier import StageTimer

    for value in gc.get_objects():
        if issubclass(type(value), StageTimer):  # type(): isinstance can wake torch's lazy names
            value.close()


def _check_snippet(example: Example) -> None:
    match = SNIPPET.match(example.code.strip())
    assert match, f"{example.name}: an include must be the whole block"
    path, section = match.groups()
    source = (ROOT / path).read_text()
    if section:
        assert f"--8<-- [start:{section}]" in source, f"{example.name}: no section {section}"
        assert f"--8<-- [end:{section}]" in source, f"{example.name}: section {section} not ended"


def test_the_pages_hold_examples() -> None:
    pages = {example.page.name for example in EXAMPLES}
    assert {"README.md", "how-it-works.md", "integrations.md", "getting-started.md"} <= pages


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_documentation_example_runs(
    example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example.code.lstrip().startswith("--8<--"):
        _check_snippet(example)
        return
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    namespace = _namespace(example, tmp_path)
    with _process_group(example.code), _otlp_receiver(example.code, monkeypatch):
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", DEPRECATED_KEYWORDS, DeprecationWarning)
                exec(compile(example.code, example.name, "exec"), namespace)
        finally:
            _close_timers()
