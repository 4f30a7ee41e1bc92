"""OpenTelemetry metrics of the latest window, pushed over OTLP/HTTP by rank 0 (extra ``otel``)."""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..analysis.window_metrics import WindowMetrics
from ..environment import current_attempt
from ..errors import SinkSettingError
from ..extras import require
from ..failures import say_failed
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")

DEFAULT_EXPORT_INTERVAL_S = 15.0
DEFAULT_EXPORT_TIMEOUT_S = 10.0
DEFAULT_MAX_LEADER_VALUES = 32
CLOSE_RETRIES_S = 2.0
"""How long into its close the sink still retries a failed export (the SDK retries, backing off,
until its export timeout: 10 s by default, when the receiver is absent)."""
MAX_RESPONSE_BYTES = 64 * 1024
"""The most of a receiver's response body read (an OTLP answer is a few bytes); the rest of a
larger one is never read."""
OTHER_LEADER = "other"
"""The ``leader_rank`` attribute of a leader beyond the first ``max_leader_values`` of a run."""
NO_LEADER_VALUE = "none"
"""The ``leader_rank`` attribute where no single rank leads the top stage."""


def job_attributes(extra: Mapping[str, str] | None = None) -> dict[str, str | int]:
    """The resource attributes that tie every series to its job: the service name, the run id
    and restart count (``TORCHELASTIC_RUN_ID``, else ``STAGEFRONTIER_RUN_ID``, else ``run``),
    the Slurm job (``SLURM_JOB_ID``, with ``SLURM_ARRAY_TASK_ID`` where set) and the host;
    ``extra`` adds or overrides attributes."""
    run_id, attempt = current_attempt()
    attributes: dict[str, str | int] = {
        "service.name": "stagefrontier",
        "stagefrontier.run_id": run_id,
        "stagefrontier.attempt": attempt,
        "host.name": socket.gethostname(),
    }
    for variable, key in (
        ("SLURM_JOB_ID", "slurm.job_id"),
        ("SLURM_ARRAY_TASK_ID", "slurm.array_task_id"),
    ):
        value = os.environ.get(variable)
        if value:
            attributes[key] = value
    attributes.update(extra or {})
    return attributes


class OtelSink:
    """The per-window metrics of the Prometheus sink, exported with the OpenTelemetry SDK over
    OTLP/HTTP (protobuf) to a collector or any OTLP receiver.

    Instruments (observable gauges read from the latest window; none before the first window):

    | metric | attributes | value |
    |---|---|---|
    | ``stagefrontier.stage.share`` | ``stage`` | share of exposed step time |
    | ``stagefrontier.top_stage`` | ``stage`` | 1 for the top stage, 0 for the others |
    | ``stagefrontier.top_stage.share`` | ``stage``, ``leader_rank`` | the top stage's share |
    | ``stagefrontier.top_stage.leader_rank`` | | rank leading the top stage (-1: none) |
    | ``stagefrontier.exposed_time_per_step`` | | exposed (frontier) step time, s |
    | ``stagefrontier.label`` | ``label`` | 1 when the label is emitted, else 0 |
    | ``stagefrontier.window``, ``.last_step``, ``.ranks_present``, ``.gather_ok`` | | |
    | ``stagefrontier.regression_per_step`` | | s per step above the healthy windows |
    | ``stagefrontier.self_cost_fraction`` | | StageFrontier's cost over the step time |

    Every series carries the job through its resource (:func:`job_attributes`:
    ``stagefrontier.run_id``, ``stagefrontier.attempt``, ``slurm.job_id``, ``host.name``,
    ``service.name``, plus ``attributes``). Cardinality is bounded: ``stage`` and ``label``
    take the schema's and the labeler's fixed sets, and ``leader_rank`` (the rank that sets the
    frontier in the top stage) takes at most ``max_leader_values`` distinct ranks per run, later
    ones reading ``other`` (the exact rank stays in ``stagefrontier.top_stage.leader_rank``).

    A thread of the sink exports every ``export_interval_s``, and :meth:`close` once more, so
    the collector thread only swaps a reference per window. ``endpoint`` is the
    full URL of the metrics path; without it the SDK reads ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
    or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318/v1/metrics``). A failed
    export is logged once on the ``stagefrontier`` logger with the reason, and the count of
    failures at close; training never sees it. The SDK's own line about each failed or retried
    metrics export is dropped (a filter on its exporter loggers, from the sink's start).

    Needs ``pip install 'stagefrontier[otel]'``.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        attributes: Mapping[str, str] | None = None,
        export_interval_s: float = DEFAULT_EXPORT_INTERVAL_S,
        export_timeout_s: float = DEFAULT_EXPORT_TIMEOUT_S,
        max_leader_values: int = DEFAULT_MAX_LEADER_VALUES,
    ) -> None:
        require("opentelemetry.sdk.metrics", "otel", "OtelSink")
        require("opentelemetry.exporter.otlp.proto.http.metric_exporter", "otel", "OtelSink")
        for name, value in (
            ("export_interval_s", export_interval_s),
            ("export_timeout_s", export_timeout_s),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value <= 86400
            ):
                raise SinkSettingError(f"OtelSink {name} must be in (0, 86400] seconds: {value!r}")
        if endpoint is not None and not _is_http_url(endpoint):
            raise SinkSettingError(
                f"OtelSink endpoint must be an http:// or https:// URL with a host: {endpoint!r}"
            )
        if (
            isinstance(max_leader_values, bool)
            or not isinstance(max_leader_values, int)
            or (max_leader_values < 0)
        ):
            raise SinkSettingError(
                f"OtelSink max_leader_values must be >= 0: {max_leader_values!r}"
            )
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.attributes = job_attributes(attributes)
        self.export_interval_s = float(export_interval_s)
        self.export_timeout_s = float(export_timeout_s)
        self.max_leader_values = max_leader_values
        self._latest: WindowMetrics | None = None
        self._leaders: set[int] = set()
        self._provider: Any = None
        self._reader: Any = None
        self._exporter: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._said: set[tuple[str, str]] = set()  # collection failures said so far

    def start(self) -> None:
        """Build the meter provider and start the export thread (idempotent). Call on rank 0
        only."""
        with self._lock:
            if self._provider is not None:
                return
            _quiet_sdk_export_failures()
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource

            self._exporter = _exporter(self.endpoint, self.headers, self.export_timeout_s)
            # no SDK thread (an infinite interval): this sink's own thread exports, so that
            # close() knows when the last export has ended
            self._reader = PeriodicExportingMetricReader(
                self._exporter, export_interval_millis=math.inf
            )
            provider = MeterProvider(
                resource=Resource.create(self.attributes), metric_readers=[self._reader]
            )
            _instruments(provider.get_meter("stagefrontier"), self)
            self._provider = provider
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._export_periodically, name="stagefrontier-otel", daemon=True
            )
            self._thread.start()
        logger.info("stagefrontier: OpenTelemetry metrics to %s", self._exporter.target)

    def write(self, window: AnalyzedWindow) -> None:
        self.start()
        self._latest = window.metrics  # one reference swap: an export sees whole windows

    def close(self) -> None:
        """Stop the export thread, export the latest window once more on this thread and shut
        the provider down. A request under way is bounded by ``export_timeout_s``; retries of a
        failed one (a receiver that is not there) end ``CLOSE_RETRIES_S`` into the close."""
        with self._lock:
            provider, self._provider = self._provider, None
        if provider is None:
            return
        self._stop.set()
        no_more_retries = threading.Timer(CLOSE_RETRIES_S, self._exporter.shutdown)
        no_more_retries.daemon = True
        no_more_retries.start()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=2 * self.export_timeout_s + 1)
            if thread.is_alive():
                logger.warning(
                    "stagefrontier: an OpenTelemetry export to %s still runs after %.0f s at "
                    "close; leaving it",
                    self._exporter.target,
                    2 * self.export_timeout_s + 1,
                )
        self._export_once()
        no_more_retries.cancel()
        provider.shutdown(timeout_millis=self.export_timeout_s * 1e3)
        failures = self._exporter.failures
        if failures:
            logger.warning(
                "stagefrontier: %d OpenTelemetry export(s) to %s failed in this run (first: %s)",
                failures,
                self._exporter.target,
                self._exporter.first_error,
            )

    def _export_periodically(self) -> None:
        while not self._stop.wait(self.export_interval_s):
            self._export_once()

    def _export_once(self) -> None:
        try:
            self._reader.collect(timeout_millis=self.export_timeout_s * 1e3)
        except Exception as exc:  # the SDK's collection timing out, or a bug: never raise
            say_failed(
                logger, "OpenTelemetry collection", exc, "the next export tries again", self._said
            )

    def leader_value(self, rank: int) -> str:
        """The ``leader_rank`` attribute of ``rank``: the rank itself among the first
        ``max_leader_values`` leaders of the run, else ``other``."""
        if rank < 0:
            return NO_LEADER_VALUE
        if rank in self._leaders:
            return str(rank)
        if len(self._leaders) < self.max_leader_values:
            self._leaders.add(rank)
            return str(rank)
        return OTHER_LEADER


def _exporter(endpoint: str | None, headers: Mapping[str, str], timeout_s: float) -> Any:
    """An OTLP/HTTP metric exporter that remembers its failures and logs the first one."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    class CountingExporter(OTLPMetricExporter):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(
                endpoint=endpoint,
                headers=dict(headers) or None,
                timeout=timeout_s,
                session=_bounded_session(),
            )
            self.target = endpoint or getattr(self, "_endpoint", None) or "the OTLP default"
            self.failures = 0
            self.shut = False
            self.first_error: str | None = None

        def shutdown(self, timeout_millis: float = 30_000, **kw: Any) -> None:
            if not self.shut:  # once: the sink's close may have ended its retries already
                self.shut = True
                super().shutdown(timeout_millis, **kw)

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kw: Any) -> Any:
            if self.shut:  # the sink closed: nothing more to send
                return MetricExportResult.FAILURE
            try:
                result = super().export(metrics_data, timeout_millis=timeout_millis, **kw)
            except Exception as exc:  # an exporter bug must not end the export thread
                result, error = MetricExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
            else:
                error = "the receiver refused it or could not be reached"
            if result != MetricExportResult.SUCCESS:
                self.failures += 1
                if self.first_error is None:
                    self.first_error = error
                    logger.warning(
                        "stagefrontier: OpenTelemetry export to %s failed (%s); the windows go "
                        "on to the other sinks, and the count of failures is logged at close",
                        self.target,
                        error,
                    )
            return result

    return CountingExporter()


SDK_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
)
"""The OpenTelemetry loggers that log each failed metrics export (and each retry) themselves."""


class _MetricsExportFailures(logging.Filter):
    """Drops the SDK's own line about a failed or retried metrics export: the sink says the
    first failure in its words and counts the rest at close. Other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING or "metrics batch" not in record.getMessage()


_METRICS_EXPORT_FAILURES = _MetricsExportFailures()


def _quiet_sdk_export_failures() -> None:
    for name in SDK_EXPORT_LOGGERS:
        logging.getLogger(name).addFilter(_METRICS_EXPORT_FAILURES)  # a set: added once


def _is_http_url(endpoint: object) -> bool:
    if not isinstance(endpoint, str):
        return False
    try:
        parts = urlsplit(endpoint)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port out of range or not a number
        return False


def _bounded_session() -> Any:
    """A requests session that reads at most ``MAX_RESPONSE_BYTES`` of a response body and
    closes the connection on the rest (before: a 300 MB answer was read into memory)."""
    import requests

    class BoundedSession(requests.Session):
        def request(self, *args: Any, **kwargs: Any) -> Any:
            kwargs["stream"] = True
            response = super().request(*args, **kwargs)
            try:
                body = response.raw.read(MAX_RESPONSE_BYTES, decode_content=True)
                response._content = body or b""
                response._content_consumed = True
            finally:
                response.close()
            return response

    return BoundedSession()


def _instruments(meter: Any, sink: OtelSink) -> None:
    """Observable gauges over the sink's latest window."""
    from opentelemetry.metrics import Observation

    def latest() -> WindowMetrics | None:
        return sink._latest

    def gauge(name: str, description: str, unit: str, read: Any) -> None:
        def callback(_options: Any) -> Iterable[Observation]:
            m = latest()
            return [] if m is None else [Observation(v, a) for v, a in read(m)]

        meter.create_observable_gauge(
            f"stagefrontier.{name}", callbacks=[callback], unit=unit, description=description
        )

    def scalar(value: Any) -> Any:
        return lambda m: [(float(value(m)), {})]

    gauge(
        "stage.share",
        "Share of exposed step time, latest window",
        "1",
        lambda m: [(v, {"stage": s}) for s, v in m.shares.items()],
    )
    gauge(
        "top_stage",
        "1 for the stage with the largest share",
        "1",
        lambda m: [(float(s == m.top1), {"stage": s}) for s in m.shares],
    )
    gauge(
        "top_stage.share",
        "The top stage's share, with the rank that sets the frontier there",
        "1",
        lambda m: (
            []
            if m.top1 is None or m.top1_share is None
            else [
                (m.top1_share, {"stage": m.top1, "leader_rank": sink.leader_value(m.leader_rank)})
            ]
        ),
    )
    gauge(
        "top_stage.leader_rank",
        "Rank leading the top stage (-1: none)",
        "1",
        scalar(lambda m: m.leader_rank),
    )
    gauge(
        "exposed_time_per_step",
        "Exposed (frontier) step time",
        "s",
        scalar(lambda m: m.exposed_ms_per_step * 1e-3),
    )
    gauge(
        "label",
        "1 when the label is emitted for the window",
        "1",
        lambda m: [(float(f), {"label": x}) for x, f in m.label_flags.items()],
    )
    gauge("window", "Index of the latest analyzed window", "1", scalar(lambda m: m.window))
    gauge(
        "last_step", "Last training step of the latest window", "1", scalar(lambda m: m.last_step)
    )
    gauge(
        "ranks_present",
        "Ranks whose data reached the latest window",
        "1",
        scalar(lambda m: m.n_ranks),
    )
    gauge("gather_ok", "1 when every rank's window arrived", "1", scalar(lambda m: m.gather_ok))
    gauge(
        "regression_per_step",
        "Exposed step time above the run's healthy windows (0: no regression)",
        "s",
        scalar(lambda m: m.regression_ms_per_step * 1e-3),
    )
    gauge(
        "self_cost_fraction",
        "StageFrontier's own cost over the step time, largest over ranks",
        "1",
        scalar(lambda m: m.self_cost_fraction),
    )
