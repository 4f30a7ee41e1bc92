"""What the docs promise for a process group that is not Gloo (NCCL and the other device
backends, which complete a collective's future on the host once it is queued): ``watch_ddp``
and ``watch_fsdp`` return False, leave the model as it is, warn once, and every window record
says so in ``communication.untimed``.

NCCL needs a GPU; torch's own ``fake`` backend is a real non-Gloo process group that runs here
(its collectives complete at once, as a device backend's future does on the host).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.testing._internal.distributed.fake_pg")

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from stagefrontier import CollectConfig, StageTimer, TimerConfig


@pytest.fixture
def fake_group() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_non_gloo_group_is_left_untimed_warned_once_and_said_in_every_record(
    fake_group: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    hooks_before = list(getattr(model, "_comm_hooks", []))
    sharded = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    timer = StageTimer(config=TimerConfig(window=2, collection=CollectConfig(out_dir=tmp_path)))
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        assert timer.watch_ddp(model) is False
        assert timer.watch_ddp(model) is False
        assert timer.watch_fsdp(sharded) is False
        for _ in range(4):
            with timer.step(), timer.stage("model.fwd_loss_cpu_wall"):
                model(torch.randn(2, 4)).sum()
        timer.close()
    assert list(getattr(model, "_comm_hooks", [])) == hooks_before  # left as it is
    warned = [r.getMessage() for r in caplog.records if "backend" in r.getMessage()]
    assert len(warned) == 2, warned  # once for DDP, once for FSDP2
    assert "DDP buckets not timed: the fake backend" in warned[0]
    assert "FSDP2 collectives not timed: the fake backend" in warned[1]
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for record in records:
        untimed = record["communication"]["untimed"]
        assert any(u.startswith("DDP buckets not timed: the fake backend") for u in untimed)
        assert any(u.startswith("FSDP2 collectives not timed: the fake backend") for u in untimed)
        assert record["communication"]["collectives"] == []
