"""Prometheus gauges of the latest window, served from rank 0 (extra ``prometheus``)."""

from __future__ import annotations

import logging
from typing import Any

from ..analysis.window_metrics import WindowMetrics
from ..extras import require
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")

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
    its collector is built (the collector calls :meth:`start`), or else at the
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
        self._latest = window.metrics  # one reference swap: scrapes see whole windows

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
            (
                "regression_seconds_per_step",
                "Exposed step time above the run's healthy windows (0: no regression)",
                m.regression_ms_per_step * 1e-3,
            ),
            (
                "self_cost_fraction",
                "StageFrontier's own cost over the step time, largest over ranks",
                m.self_cost_fraction,
            ),
        )
        for name, doc, value in scalars:
            g = family(name, doc)
            g.add_metric([], float(value))
            yield g
        labels = family("label", "1 when the label is emitted for the window", ("label",))
        for label, flag in m.label_flags.items():
            labels.add_metric([label], float(flag))
        yield labels
