"""No single store read turns a rank's router off: the request key deleted while a rank reads it,
and reads that fail for a while, on real Gloo ranks around the job's real TCPStore (see
``store_race_support`` for the schedules); and ``read_key`` on each kind of c10d store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from stagefrontier.demo.launch import run_ranks
from stagefrontier.route import list_incidents
from stagefrontier.route.requests import REQUEST_KEY, RequestChannel, read_key
from store_race_support import (
    CAPTURES,
    FLAKY_READS,
    LOG_FILE,
    SCHEDULE_FILE,
    RaceJob,
    run_rank,
)

RANKS = 3


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> RaceJob:
    job = RaceJob(out_dir=str(tmp_path_factory.mktemp("race")), ranks=RANKS)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=400.0)
    assert codes == dict.fromkeys(range(RANKS), 0), f"rank exit codes {codes}"
    return job


def _log(job: RaceJob, rank: int) -> str:
    return Path(job.out_dir, LOG_FILE.format(rank=rank)).read_text(encoding="utf-8")


def _schedule(job: RaceJob, rank: int) -> dict[str, Any]:
    path = Path(job.out_dir, SCHEDULE_FILE.format(rank=rank))
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_a_request_deleted_while_a_rank_reads_it_leaves_its_router_on(job: RaceJob) -> None:
    """Before: the read was a ``check`` then a ``get``; rank 0 deleted the key between them (the
    first incident closed), the ``get`` waited the store's 30 s timeout, and rank 1 logged
    "router store unavailable, router off" and never answered the second capture."""
    assert _schedule(job, 1)["held"] == 1  # the schedule ran: the key went during the read
    incidents = sorted(list_incidents(job.out_dir), key=lambda i: i["id"])
    assert len(incidents) == CAPTURES
    for incident in incidents:
        assert incident["captured"], incident["reasons"]
        assert incident["ranks"] == list(range(RANKS))
    log = _log(job, 1)
    assert "router off" not in log and "WARNING" not in log, log


def test_failed_reads_back_off_and_are_said_once(job: RaceJob) -> None:
    """Before: the first failed read turned rank 2's router off for the rest of the run. Now
    it reads again later, says so in one line, and answers the next capture."""
    assert _schedule(job, 2)["raised"] == FLAKY_READS
    log = _log(job, 2)
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, log
    assert "reading the capture request failed" in warnings[0]
    assert "backing off" in warnings[0]
    assert f"injected store failure 1 of {FLAKY_READS}" in warnings[0]
    assert f"readable again after {FLAKY_READS} failed read(s)" in log
    second = max(list_incidents(job.out_dir), key=lambda i: i["id"])
    assert second["captured"] and 2 in second["ranks"], second["reasons"]


def test_read_key_reads_a_value_or_none_without_waiting_on_every_store(tmp_path: Path) -> None:
    """``read_key`` is one request that never waits for the key: on a TCP, a file and a hash
    store, through a prefix, a key absent, present, then deleted."""
    import torch.distributed as dist

    from stagefrontier.collect.node_store import loopback_store

    stores = {
        "tcp": loopback_store(world_size=1, timeout_s=2.0),
        "file": dist.FileStore(str(tmp_path / "store"), 1),
        "hash": dist.HashStore(),
    }
    for kind, store in stores.items():
        channel = RequestChannel(prefix="p", open_raw=lambda store=store: store)
        assert channel.read(REQUEST_KEY) is None, kind
        channel.write(REQUEST_KEY, b'{"id": "w1"}')
        assert channel.read(REQUEST_KEY) == b'{"id": "w1"}', kind
        channel.delete(REQUEST_KEY)
        assert channel.read(REQUEST_KEY) is None, kind
        assert not channel.conn().check([REQUEST_KEY]), kind  # the read wrote nothing
        assert read_key(store, "never/written") is None, kind
