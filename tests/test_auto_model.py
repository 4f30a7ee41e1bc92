"""Which module the automatic hooks time as the model: the one whose parameters the optimizer
steps, not a module the loop calls before it (an augmentation in training mode).

Cost: one process, 12 steps of a tiny model in the test's own interpreter (well under a second);
the hooks are removed at the end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from stagefrontier.auto.driver import AUTO_STAGES, AutoDriver  # noqa: E402
from stagefrontier.integrations._timer import TimerArguments  # noqa: E402

STEPS = 12
WINDOW = 5


class Jitter(nn.Module):
    """An augmentation with no parameters: noise added to the batch in training mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01 * torch.randn_like(x) if self.training else x


def test_an_augmentation_called_before_the_model_is_not_taken_for_it(tmp_path: Path) -> None:
    torch.manual_seed(0)
    jitter = Jitter()
    frozen = nn.Linear(8, 8).requires_grad_(False)  # parameters the optimizer does not step
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(STEPS, 8), torch.randn(STEPS, 1)), batch_size=1)
    arguments = TimerArguments("the test's", [], None, {"window": WINDOW, "out_dir": str(tmp_path)})
    driver = AutoDriver(arguments)
    driver.install()
    try:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(frozen(jitter(x))), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        driver.stop()
    assert driver.model is model
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [r["n_steps"] for r in records] == [5, 5, 1]  # the first step is watched, not timed
    assert all(r["stages"] == list(AUTO_STAGES) for r in records)
    assert all(r["contract_violations"] == 0 for r in records)
