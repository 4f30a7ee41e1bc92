"""``timer.watch_fsdp`` and ``timer.watch_zero`` on real torch objects in one process: a
single-rank Gloo group, and a non-Gloo group (torch's fake backend) for a device backend.

- A model whose group is not Gloo is left as it is: False, and the reason said once.
- A custom collective set before ``watch_fsdp`` runs inside the timed one, not dropped.
- Watching twice wraps once and gives the first answer (FSDP2 and ZeRO-1 alike).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
fsdp = pytest.importorskip("torch.distributed.fsdp")

from recorder_support import DATA, FWD, CaptureCollector  # noqa: E402
from stagefrontier import StageTimer, TimerConfig  # noqa: E402
from stagefrontier.record.sharded_collectives import TimedAllGather, TimedReduceScatter  # noqa: E402


@pytest.fixture
def gloo() -> Iterator[None]:
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed with no process group yet")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def timer() -> StageTimer:
    config = TimerConfig(stages=(DATA, FWD), window=2)
    return StageTimer(config=config, collector=CaptureCollector())


def groups(module: Any) -> list[Any]:
    return list(module._get_fsdp_state()._fsdp_param_groups)


class CountedReduceScatter:
    """The program's own reduce-scatter: counts its calls, runs FSDP2's default one."""

    def __init__(self) -> None:
        self.calls = 0

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output: Any, input: Any, group: Any, op: Any, async_op: bool = False) -> Any:
        self.calls += 1
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return scatter(output, input, op=op, group=group, async_op=async_op)


def test_a_model_on_a_non_gloo_group_is_left_alone_and_said_once(
    gloo: None, caplog: pytest.LogCaptureFixture
) -> None:
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    assert fake_pg  # registers the "fake" backend
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.new_group(backend="fake"), "cpu")
    model = fsdp.fully_shard(torch.nn.Linear(4, 4), mesh=mesh)
    before = (groups(model)[0]._all_gather_comm, groups(model)[0]._reduce_scatter_comm)
    t = timer()
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        assert t.watch_fsdp(model) is False
        assert t.watch_fsdp(model) is False
    assert (groups(model)[0]._all_gather_comm, groups(model)[0]._reduce_scatter_comm) == before
    assert "set_custom_all_gather" not in vars(model)  # the module's own setters
    said = [r.getMessage() for r in caplog.records if "fake backend" in r.getMessage()]
    assert len(said) == 1 and "FSDP2 collectives not timed" in said[0]
    t.close()


def test_a_custom_collective_set_before_runs_inside_the_timed_one(gloo: None) -> None:
    model = fsdp.fully_shard(torch.nn.Linear(4, 4))
    own = CountedReduceScatter()
    model.set_custom_reduce_scatter(own)
    t = timer()
    assert t.watch_fsdp(model) is True
    group = groups(model)[0]
    assert isinstance(group._all_gather_comm, TimedAllGather)
    scatter = group._reduce_scatter_comm
    assert isinstance(scatter, TimedReduceScatter) and scatter.inner is own
    output, grads = torch.empty(4), torch.ones(4)
    scatter(output, grads, group.mesh_info.shard_process_group, dist.ReduceOp.SUM)
    assert own.calls == 1 and torch.equal(output, grads)
    t.close()


def test_watching_a_model_twice_wraps_it_once(gloo: None) -> None:
    model = fsdp.fully_shard(torch.nn.Sequential(fsdp.fully_shard(torch.nn.Linear(4, 4))))
    t = timer()
    assert t.watch_fsdp(model) is True
    first = [(g._all_gather_comm, g._reduce_scatter_comm) for g in groups(model[0])]
    assert t.watch_fsdp(model) is True
    assert t.watch_fsdp(model[0]) is True  # inside the model watched before
    assert [(g._all_gather_comm, g._reduce_scatter_comm) for g in groups(model[0])] == first
    assert all(comm.inner is None for pair in first for comm in pair)
    t.close()


def test_watching_zero_twice_registers_its_hooks_once(gloo: None) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    net = torch.nn.Linear(4, 4)
    optimizer = ZeroRedundancyOptimizer(net.parameters(), torch.optim.SGD, lr=0.1)
    t = timer()
    assert t.watch_zero(optimizer) is True
    assert t.watch_zero(optimizer) is True
    assert len(optimizer._optimizer_step_post_hooks) == 1
    assert len(optimizer.optim._optimizer_step_post_hooks) == 1
    t.close()
