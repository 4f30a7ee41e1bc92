"""A whole output folder (a demo's or a real job's): its analyzed windows, and the stage shares
of StageFrontier next to the five rank-local baselines on each window (``render.text`` prints
them as the run report)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import baselines
from ..analysis.accounting import FloatArray
from ..errors import StageFrontierError
from ..formats.packet import Packet, read_packet
from ..formats.records import WINDOWS_FILE, read_records


@dataclass(frozen=True)
class RunWindows:
    """The analyzed windows of one output folder, in (restart attempt, window) order."""

    folder: Path
    packets: list[Packet]
    records: list[dict[str, Any]]

    @property
    def stages(self) -> list[str]:
        return list(self.packets[0].stages) if self.packets else list(self.records[0]["stages"])


def load_run(folder: str | Path) -> RunWindows:
    """Read ``windows.jsonl`` and ``packets/`` from a folder; raises StageFrontierError if the
    folder does not exist or holds neither."""
    path = Path(folder)
    if not path.exists():
        raise StageFrontierError(f"{path} does not exist")
    if not path.is_dir():
        raise StageFrontierError(f"{path} is not a folder")
    packets = sorted(
        (read_packet(p) for p in (path / "packets").glob("window-*.json")),
        key=lambda packet: (packet.meta.get("attempt", 0), packet.meta.get("window", 0)),
    )
    jsonl = path / WINDOWS_FILE
    records = read_records(jsonl) if jsonl.exists() else []
    if not packets and not records:
        raise StageFrontierError(f"{path} holds no windows.jsonl and no packets/")
    return RunWindows(path, packets, records)


def method_shares(packet: Packet) -> dict[str, FloatArray]:
    """Stage shares of one window under StageFrontier and every baseline."""
    report = packet.report
    out = {"stagefrontier": np.array([report.shares[s] for s in report.stages])}
    for name, rule in baselines.BASELINES.items():
        out[name] = rule(packet.d)
    return out
