"""Which module the automatic hooks time as the model: the one whose parameters the optimizer
steps, not a module the loop calls before it (an augmentation in training mode). The model's
timed forward, set on the model, travels with it: ``copy.deepcopy(model)``, ``torch.save(model)``
and ``inspect.signature(model.forward)`` work while it is timed, and the model's own forward is
back once the hooks stop.

Cost: one process, 12 steps of a tiny model in the test's own interpreter (well under a second);
the hooks are removed at the end.
"""

from __future__ import annotations

import copy
import inspect
import io
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from stagefrontier.auto.driver import AUTO_STAGES, AutoDriver  # noqa: E402
from stagefrontier.auto.model import ModelForward  # noqa: E402
from stagefrontier.integrations._timer import TimerArguments  # noqa: E402

STEPS = 12
WINDOW = 5
SAVED_AT = 6
COMPILED_STEPS = 8


class Jitter(nn.Module):
    """An augmentation with no parameters: noise added to the batch in training mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x) if self.training else x


def _linear_under_the_hooks(out: Path) -> tuple[Any, Any, Any, AutoDriver]:
    """A ``Linear(8, 1)``, its SGD, a DataLoader of ``STEPS`` batches, and the automatic hooks
    installed, writing windows of ``WINDOW`` steps to ``out``."""
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(STEPS, 8), torch.randn(STEPS, 1)), batch_size=1)
    driver = AutoDriver(
        TimerArguments("the test's", [], None, {"window": WINDOW, "out_dir": str(out)})
    )
    driver.install()
    return model, optimizer, loader, driver


def test_the_model_is_the_module_the_optimizer_steps_and_copies_of_it_work(tmp_path: Path) -> None:
    torch.manual_seed(0)
    jitter = Jitter()
    frozen = nn.Linear(8, 8).requires_grad_(False)  # parameters the optimizer does not step
    model, optimizer, loader, driver = _linear_under_the_hooks(tmp_path)
    try:
        for step, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(frozen(jitter(x))), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == SAVED_AT:  # the model carries the hooks' timed forward by now
                assert "forward" in vars(model)
                assert list(inspect.signature(model.forward).parameters) == ["input"]
                best = copy.deepcopy(model)
                best(x)  # a copy's training forward is not the model's
                saved = io.BytesIO()
                torch.save(model, saved)
    finally:
        driver.stop()
    assert driver.model is model
    assert "forward" not in vars(model)  # the class's own forward again
    # the whole model pickled: the file needs no StageFrontier to load, and the stand-in of the
    # timed forward calls the model's own
    assert b"stagefrontier" not in saved.getvalue()
    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    assert torch.equal(loaded(x), best(x))
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5, 1]  # the first step is watched, not timed
    assert all(r["stages"] == list(AUTO_STAGES) for r in records)
    assert all(r["contract_violations"] == 0 for r in records)


def _train_compiled(kind: str, out: Path | None) -> tuple[list[float], Any]:
    """Eight steps of a small model, scripted, traced or compiled (``kind``), under the
    automatic hooks writing to ``out`` (or with no hooks: None); its losses and the driver."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    if kind == "script":
        model: Any = torch.jit.script(plain)
    elif kind == "trace":
        model = torch.jit.trace(plain, torch.randn(1, 8))
    else:  # the eager backend: the inductor's needs a C compiler and minutes in the suite
        model = torch.compile(plain, backend="eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(2 * COMPILED_STEPS, 8), torch.randn(2 * COMPILED_STEPS, 1))
    driver = None
    if out is not None:
        arguments = TimerArguments("the test's", [], None, {"window": 4, "out_dir": str(out)})
        driver = AutoDriver(arguments)
        driver.install()
    losses = []
    try:
        for x, y in DataLoader(data, batch_size=2):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            if driver is not None and len(losses) == COMPILED_STEPS // 2:
                assert isinstance(model.forward, ModelForward)  # timed by now
    finally:
        if driver is not None:
            driver.stop()
    return losses, driver


@pytest.mark.parametrize("kind", ["script", "trace", "compile"])
def test_a_scripted_traced_or_compiled_model_trains_as_without_the_hooks_and_its_forward_is_timed(
    tmp_path: Path, kind: str
) -> None:
    alone, _ = _train_compiled(kind, None)
    timed, driver = _train_compiled(kind, tmp_path)
    assert timed == alone  # the same losses, step for step
    assert driver is not None
    assert not isinstance(driver.model.forward, ModelForward)  # its own again
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [4, 3]  # the first step is watched, not timed
    assert all(r["contract_violations"] == 0 for r in records)
    assert all(r["advances"]["model.fwd_loss_cpu_wall"] > 0 for r in records)
    assert all(r["advances"]["model.backward_cpu_wall"] > 0 for r in records)


def test_a_backward_with_other_parameters_is_left_alone_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The backward wrapper spells out ``torch.autograd.backward``'s parameters; a torch whose
    backward takes others keeps its own, and the backward is timed in the forward stage."""
    real = torch.autograd.backward

    def other(  # type: ignore[no-untyped-def]
        tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None, *, x=0
    ):
        return real(tensors, grad_tensors, retain_graph, create_graph, inputs=inputs)

    monkeypatch.setattr(torch.autograd, "backward", other)
    monkeypatch.delenv("RANK", raising=False)
    torch.manual_seed(0)
    model, optimizer, loader, driver = _linear_under_the_hooks(tmp_path)
    try:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()
            assert torch.autograd.backward is other
            optimizer.step()
            optimizer.zero_grad()
    finally:
        driver.stop()
    said = [r.getMessage() for r in caplog.records if "no backward call seen" in r.getMessage()]
    assert len(said) == 1
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5, 1]
    assert all(r["contract_violations"] == 0 for r in records)


class _Decided(nn.Linear):
    """A module whose class decides its training flag (a property over a flag of its own)."""

    @property  # type: ignore[override]
    def training(self) -> bool:
        return self.mode

    @training.setter
    def training(self, mode: bool) -> None:
        self.__dict__["mode"] = mode


@pytest.mark.parametrize("kind", ["plain", "script", "trace", "property"])
def test_an_evaluation_forward_between_steps_is_not_timed(tmp_path: Path, kind: str) -> None:
    """The timed forward reads the model's training flag at every call: from the instance dict
    where ``nn.Module`` keeps it, or, for a module whose class decides it (a scripted or traced
    module's lives in its C++ module; a property), by attribute. An evaluation forward with
    gradients on, after each step, opens no step of its own."""
    from stagefrontier.auto.model import module_state

    torch.manual_seed(0)
    plain = _Decided(8, 1) if kind == "property" else nn.Linear(8, 1)
    if kind == "property":
        plain.__dict__["training"] = True  # a stale copy beside the property: never read
    model: Any = {
        "script": lambda: torch.jit.script(plain),
        "trace": lambda: torch.jit.trace(plain, torch.randn(1, 8)),
    }.get(kind, lambda: plain)()
    state = module_state(model)
    assert (state is vars(model)) == (kind == "plain")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(STEPS, 8), torch.randn(STEPS, 1)), batch_size=1)
    arguments = TimerArguments("the test's", [], None, {"window": WINDOW, "out_dir": str(tmp_path)})
    driver = AutoDriver(arguments)
    driver.install()
    try:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            model.eval()
            assert not state["training"]
            model(x)  # a validation forward, gradients on
            model.train()
    finally:
        driver.stop()
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5, 1]  # one a training step, the first watched
    assert all(r["contract_violations"] == 0 for r in records)
