"""The router's words for a setting without a store (issue 37, item 12)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_a_single_process_router_without_a_store_says_so_in_the_librarys_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 12: a single-process timer with a router and no store said only
    ``'MASTER_ADDR'`` (a KeyError's text)."""
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    caplog.set_level(logging.WARNING, logger="stagefrontier")
    timer = StageTimer(
        config=TimerConfig(
            stages=["data.next_wait"],
            window=5,
            collection=CollectConfig("local", out_dir=tmp_path, log=False),
            router=ProfilerRouter(),
        )
    )
    for _ in range(5000):
        if "capture request" in caplog.text:
            break
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.01)
    timer.close()
    said = [r.getMessage() for r in caplog.records if "capture request" in r.getMessage()]
    assert len(said) == 1, said
    assert "no store to use: no process group, no store given" in said[0]
