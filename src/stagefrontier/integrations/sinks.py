"""Sinks for the tools training jobs already watch: TensorBoard, Prometheus, W&B, and CSV.

Every sink follows :class:`stagefrontier.sinks.core.Sink`: ``write(window)`` on rank 0's analysis
thread once per analyzed window, ``close()`` when the timer closes. Each one writes the same few
numbers, taken by :func:`window_metrics` from the window's report:

- the share of exposed step time per stage (accumulation substages ``name[i]`` folded into
  ``name``, so the set of series does not change with the accumulation factor); only when the
  window's shares are defined (it had exposed time);
- the exposed step time (frontier step time) in milliseconds per step;
- the top stage, its share, and its leader rank (``-1`` where no single rank leads it);
- one 0/1 flag per label of :data:`stagefrontier.ALL_LABELS`.

The optional packages are imported when a sink is built; a missing one raises
:class:`~stagefrontier.integrations.MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.labels import ALL_LABELS
from ..analysis.schema import semantic_stage
from ..record.window import AnalyzedWindow
from ._extras import require

logger = logging.getLogger("stagefrontier")

NO_LEADER = -1
"""Leader rank written where the top stage has no single leading rank."""


@dataclass(frozen=True)
class WindowMetrics:
    """The numbers every integration sink writes for one window."""

    window: int
    first_step: int
    last_step: int
    n_steps: int
    n_ranks: int
    exposed_ms_per_step: float
    shares: dict[str, float]
    """Per broad stage, in schema order; empty when the window's shares are undefined."""
    top1: str | None
    top1_share: float | None
    leader_rank: int
    labels: tuple[str, ...]
    label_flags: dict[str, int]
    gather_ok: bool


def window_metrics(window: AnalyzedWindow) -> WindowMetrics:
    """Extract the sinks' numbers from an analyzed window."""
    report = window.report
    record = window.record
    defined = report.shares_defined
    top1 = report.top1
    lead = report.semantic_localization[top1].leader_rank if top1 is not None else None
    return WindowMetrics(
        window=int(record["window"]),
        first_step=int(record["first_step"]),
        last_step=int(record["last_step"]),
        n_steps=report.n_steps,
        n_ranks=report.n_ranks,
        exposed_ms_per_step=report.mean_step_s * 1e3,
        shares=dict(report.semantic_shares) if defined else {},
        top1=top1,
        top1_share=report.semantic_shares[top1] if defined and top1 is not None else None,
        leader_rank=NO_LEADER if lead is None else int(lead),
        labels=tuple(report.labels),
        label_flags={label: int(label in report.labels) for label in ALL_LABELS},
        gather_ok=bool(record.get("gather_ok", True)),
    )


# ---------------------------------------------------------------------------------- TensorBoard
class TensorBoardSink:
    """Scalars through ``torch.utils.tensorboard.SummaryWriter``, at ``global_step`` = the
    window's last step:

    - ``stagefrontier/share/<stage>``
    - ``stagefrontier/exposed_ms_per_step``
    - ``stagefrontier/top1_share``, ``stagefrontier/top1_leader_rank`` (-1: no single leader)
    - ``stagefrontier/label/<label>`` (0 or 1)

    Args:
        log_dir: event file folder (TensorBoard's ``--logdir``); ignored when ``writer`` is given.
        writer: an existing ``SummaryWriter`` (e.g. ``TensorBoardLogger.experiment`` in Lightning)
            to add the scalars to; it is flushed but not closed by this sink.
        prefix: the tag prefix.

    Needs ``pip install 'stagefrontier[tensorboard]'``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        writer: Any = None,
        prefix: str = "stagefrontier",
    ) -> None:
        require("tensorboard", "tensorboard", "TensorBoardSink")
        # Imported here, on the caller's thread: importing it later on the analysis thread would
        # hold the GIL for a noticeable time in the middle of training.
        from torch.utils.tensorboard import SummaryWriter

        self._writer_class = SummaryWriter
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.prefix = prefix
        self._writer = writer
        self._owned = writer is None

    @property
    def writer(self) -> Any:
        """The SummaryWriter (created on rank 0 only, so other ranks make no event files)."""
        if self._writer is None:
            self._writer = self._writer_class(log_dir=self.log_dir)
        return self._writer

    def start(self) -> None:
        """Open the event file now (rank 0, when the timer is built) rather than at the first
        window."""
        _ = self.writer

    def write(self, window: AnalyzedWindow) -> None:
        m = window_metrics(window)
        w = self.writer
        p = self.prefix
        step = m.last_step
        for stage, share in m.shares.items():
            w.add_scalar(f"{p}/share/{stage}", share, global_step=step)
        w.add_scalar(f"{p}/exposed_ms_per_step", m.exposed_ms_per_step, global_step=step)
        if m.top1_share is not None:
            w.add_scalar(f"{p}/top1_share", m.top1_share, global_step=step)
        w.add_scalar(f"{p}/top1_leader_rank", m.leader_rank, global_step=step)
        for label, flag in m.label_flags.items():
            w.add_scalar(f"{p}/label/{label}", flag, global_step=step)
        w.flush()

    def close(self) -> None:
        if self._writer is not None:
            if self._owned:
                self._writer.close()
                self._writer = None
            else:
                self._writer.flush()


# ----------------------------------------------------------------------------------- Prometheus
DEFAULT_PROMETHEUS_PORT = 9185


class PrometheusSink:
    """Gauges of the latest window, served over HTTP from rank 0 for Prometheus to scrape.

    Metrics (in a registry of their own, never the process-global one; none before the first
    window, so a scrape never reads placeholder zeros):

    - ``stagefrontier_stage_share{stage}``: share of exposed step time
    - ``stagefrontier_exposed_seconds_per_step``
    - ``stagefrontier_top_stage{stage}``: 1 for the top stage, 0 for the others
    - ``stagefrontier_top_stage_leader_rank`` (-1: no single leader)
    - ``stagefrontier_label{label}``: 1 when the label is emitted, else 0
    - ``stagefrontier_window``, ``stagefrontier_last_step``, ``stagefrontier_ranks_present``,
      ``stagefrontier_gather_ok``

    The endpoint binds to ``addr`` (127.0.0.1 unless you choose otherwise: open it to the network
    deliberately) on ``port`` (0 picks a free port; see :attr:`port`). It starts on rank 0 when
    the timer is built (the integrations and ``make_timer`` call :meth:`start`), or else at the
    first window, so the other ranks of a job sharing a host never compete for the port.

    Needs ``pip install 'stagefrontier[prometheus]'``.
    """

    def __init__(
        self,
        port: int = DEFAULT_PROMETHEUS_PORT,
        addr: str = "127.0.0.1",
        *,
        namespace: str = "stagefrontier",
    ) -> None:
        client = require("prometheus_client", "prometheus", "PrometheusSink")
        self.addr = addr
        self.namespace = namespace
        self._requested_port = port
        self._server: Any = None
        self._latest: WindowMetrics | None = None
        self.registry = client.CollectorRegistry(auto_describe=False)
        self.registry.register(_LatestWindowCollector(self))

    @property
    def port(self) -> int | None:
        """The port served on, once started (the chosen one when ``port=0``)."""
        if self._server is None:
            return None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str | None:
        port = self.port
        return None if port is None else f"http://{self.addr}:{port}/metrics"

    def start(self) -> None:
        """Serve the registry (idempotent). Call on rank 0 only."""
        if self._server is not None:
            return
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(
            self._requested_port, addr=self.addr, registry=self.registry
        )
        logger.info("stagefrontier: Prometheus metrics at %s", self.url)

    def write(self, window: AnalyzedWindow) -> None:
        self.start()
        self._latest = window_metrics(window)  # one reference swap: scrapes see whole windows

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _LatestWindowCollector:
    """A prometheus_client custom collector over the sink's latest window."""

    def __init__(self, sink: PrometheusSink) -> None:
        self._sink = sink

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        m = self._sink._latest
        if m is None:
            return
        ns = self._sink.namespace

        def family(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
            return GaugeMetricFamily(f"{ns}_{name}", doc, labels=list(labels) if labels else None)

        share = family("stage_share", "Share of exposed step time, latest window", ("stage",))
        top = family("top_stage", "1 for the stage with the largest share", ("stage",))
        for stage, value in m.shares.items():
            share.add_metric([stage], value)
            top.add_metric([stage], 1.0 if stage == m.top1 else 0.0)
        yield share
        yield top
        scalars = (
            (
                "exposed_seconds_per_step",
                "Exposed (frontier) step time",
                m.exposed_ms_per_step * 1e-3,
            ),
            ("top_stage_leader_rank", "Rank leading the top stage (-1: none)", m.leader_rank),
            ("window", "Index of the latest analyzed window", m.window),
            ("last_step", "Last training step of the latest window", m.last_step),
            ("ranks_present", "Ranks whose data reached the latest window", m.n_ranks),
            ("gather_ok", "1 when every rank's window arrived", 1.0 if m.gather_ok else 0.0),
        )
        for name, doc, value in scalars:
            g = family(name, doc)
            g.add_metric([], float(value))
            yield g
        labels = family("label", "1 when the label is emitted for the window", ("label",))
        for label, flag in m.label_flags.items():
            labels.add_metric([label], float(flag))
        yield labels


# ------------------------------------------------------------------------------------------ W&B
class WandbSink:
    """Logs each window to Weights & Biases with ``run.log``.

    Keys are ``<prefix>/share/<stage>``, ``<prefix>/exposed_ms_per_step``,
    ``<prefix>/top1_share``, ``<prefix>/top1_leader_rank``, ``<prefix>/label/<label>``, plotted
    against ``<prefix>/step`` (the window's last step) through ``define_metric``, so the run's own
    step counter and the trainer's logging are left alone.

    The run is chosen at the first window: ``run`` if given, else the active ``wandb.run`` (the
    one a Lightning ``WandbLogger`` or the HF ``WandbCallback`` opened), else a new run started
    with ``wandb.init(project=project, **init_kwargs)``, finished by :meth:`close`. ``wandb``
    reads ``WANDB_MODE`` (``offline`` works with no network: the run is written under
    ``WANDB_DIR`` for a later ``wandb sync``) and ``WANDB_DIR`` as usual.

    Needs ``pip install 'stagefrontier[wandb]'``.
    """

    def __init__(
        self,
        *,
        project: str = "stagefrontier",
        run: Any = None,
        prefix: str = "stagefrontier",
        **init_kwargs: Any,
    ) -> None:
        self._wandb = require("wandb", "wandb", "WandbSink")
        self.project = project
        self.prefix = prefix
        self.init_kwargs = init_kwargs
        self._run = run
        self._owned = False
        self._defined = False

    @property
    def run(self) -> Any:
        """The run written to (None before the first window). Chosen then rather than when the
        timer is built, so that it joins the run a framework logger opens at training start."""
        return self._run

    def _ensure_run(self) -> Any:
        if self._run is None:
            active = getattr(self._wandb, "run", None)
            if active is not None:
                self._run = active
            else:
                self._run = self._wandb.init(project=self.project, **self.init_kwargs)
                self._owned = True
        if not self._defined:
            p = self.prefix
            self._run.define_metric(f"{p}/step")
            self._run.define_metric(f"{p}/*", step_metric=f"{p}/step")
            self._defined = True
        return self._run

    def write(self, window: AnalyzedWindow) -> None:
        m = window_metrics(window)
        p = self.prefix
        data: dict[str, Any] = {
            f"{p}/step": m.last_step,
            f"{p}/window": m.window,
            f"{p}/exposed_ms_per_step": m.exposed_ms_per_step,
            f"{p}/top1_leader_rank": m.leader_rank,
        }
        if m.top1_share is not None:
            data[f"{p}/top1_share"] = m.top1_share
        data.update({f"{p}/share/{stage}": share for stage, share in m.shares.items()})
        data.update({f"{p}/label/{label}": flag for label, flag in m.label_flags.items()})
        self._ensure_run().log(data)

    def close(self) -> None:
        if self._run is not None and self._owned:
            self._run.finish()
            self._owned = False
        self._run = None
        self._defined = False


# ------------------------------------------------------------------------------------------ CSV
CSV_FIELDS = (
    "window",
    "first_step",
    "last_step",
    "steps",
    "ranks",
    "exposed_ms_per_step",
    "top1",
    "top1_share",
    "leader_rank",
    "labels",
)
"""The fixed leading columns; one ``share:<stage>`` column per stage follows."""


class CsvSink:
    """One row per window in a CSV file: the fixed :data:`CSV_FIELDS` (labels joined by ``;``,
    ``leader_rank`` empty where no single rank leads), then ``share:<stage>`` per stage in schema
    order (empty where the window's shares are undefined). The header is written when the file is
    new or empty; the columns are fixed by the first window written, and a stage that appears
    later is left out with a warning. Needs nothing beyond the standard library.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: Any = None
        self._writer: csv.DictWriter[str] | None = None
        self._stage_columns: list[str] = []
        self._warned: set[str] = set()

    def write(self, window: AnalyzedWindow) -> None:
        m = window_metrics(window)
        stages = list(dict.fromkeys(semantic_stage(s) for s in window.report.stages))
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = self.path.open("a", encoding="utf-8", newline="")
            self._stage_columns = [f"share:{s}" for s in stages]
            self._writer = csv.DictWriter(
                self._file,
                fieldnames=[*CSV_FIELDS, *self._stage_columns],
                restval="",
                extrasaction="ignore",
            )
            if new:
                self._writer.writeheader()
        row: dict[str, Any] = {
            "window": m.window,
            "first_step": m.first_step,
            "last_step": m.last_step,
            "steps": m.n_steps,
            "ranks": m.n_ranks,
            "exposed_ms_per_step": f"{m.exposed_ms_per_step:.6g}",
            "top1": m.top1 or "",
            "top1_share": "" if m.top1_share is None else f"{m.top1_share:.6g}",
            "leader_rank": "" if m.leader_rank == NO_LEADER else m.leader_rank,
            "labels": ";".join(m.labels),
        }
        for stage, share in m.shares.items():
            column = f"share:{stage}"
            if column not in self._stage_columns and column not in self._warned:
                self._warned.add(column)
                logger.warning("stagefrontier: %s has no column in %s; left out", stage, self.path)
            row[column] = f"{share:.6g}"
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None


__all__ = [
    "CSV_FIELDS",
    "DEFAULT_PROMETHEUS_PORT",
    "NO_LEADER",
    "CsvSink",
    "PrometheusSink",
    "TensorBoardSink",
    "WandbSink",
    "WindowMetrics",
    "window_metrics",
]
