"""kvtier's figures on vLLM's Prometheus endpoint (``/metrics``), through
vLLM's own machinery.

- Under tiering, ``kvtier.vllm.FsTier`` declares them with
  ``build_metric_definitions`` (vLLM's ``TieringOffloadingSpec`` collects
  its secondary tiers' definitions) and reports them from ``get_stats()``,
  which vLLM's tier manager calls as it reports its own.
- The ``StorageConnector`` reports them from ``get_kv_connector_stats()``
  on its scheduler side (lookups) and its workers (dumps, loads, the
  budget); vLLM rebuilds the payload with ``build_kv_connector_stats`` and
  exports it through the ``KvtierPromMetrics`` that
  ``build_prom_metrics`` returns.

Every name starts ``vllm:kvtier_`` and carries its unit; each has a
``tier`` label: the tier's type (``FsTier``) under tiering, ``connector``
for the connector's scheduler and ``connector_r<rank>`` for its workers.
The budget's figures appear once a budget is set (``capacity_bytes``).

============================================  =========  ===============================================
name                                          type       what
============================================  =========  ===============================================
``vllm:kvtier_resident_bytes``                gauge      bytes of the blocks the budget holds
``vllm:kvtier_reserved_bytes``                gauge      bytes reserved by stores being written
``vllm:kvtier_capacity_bytes``                gauge      the budget
``vllm:kvtier_entries``                       gauge      blocks the budget holds
``vllm:kvtier_evictions_total``               counter    blocks evicted
``vllm:kvtier_evicted_bytes_total``           counter    their bytes
``vllm:kvtier_reconciles_total``              counter    reconciles with the directory (shared roots)
``vllm:kvtier_reconcile_adopted_total``       counter    blocks other processes wrote, counted
``vllm:kvtier_reconcile_forgotten_total``     counter    blocks other processes deleted, forgotten
``vllm:kvtier_lookup_hits_total``             counter    lookups answered hit
``vllm:kvtier_lookup_misses_total``           counter    lookups answered miss
``vllm:kvtier_lookup_timeouts_total``         counter    lookup groups past ``lookup_timeout`` (misses)
``vllm:kvtier_lookup_verdict_seconds``        histogram  a lookup group's time from flush to verdict
``vllm:kvtier_load_bytes_total``              counter    bytes loaded from the tier
``vllm:kvtier_load_failures_total``           counter    blocks that failed to load (recomputed)
``vllm:kvtier_store_bytes_total``             counter    bytes stored in the tier
``vllm:kvtier_store_failures_total``          counter    blocks whose store failed (never partial)
``vllm:kvtier_shutdown_dropped_total``        counter    stores and loads dropped at shutdown
============================================  =========  ===============================================

The last one counts at the tier's shutdown, after which vLLM no longer
scrapes the engine: its value reaches ``/metrics`` only when the stats are
collected once more (not in vLLM 0.32's servers); the tier's shutdown log
line is what says it there.
"""

from __future__ import annotations

from typing import Any, Optional

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)

__all__ = ["Figures", "KvtierPromMetrics", "metric_definitions", "PREFIX"]

PREFIX = "vllm:kvtier_"
LABELS = ("tier",)

#: The budget's gauges, by their name in ``capacity_stats()``.
CAPACITY_GAUGES = {
    "resident_bytes": ("resident_bytes", "Bytes of the blocks the tier's budget holds."),
    "reserved_bytes": ("reserved_bytes", "Bytes reserved by stores being written."),
    "capacity_bytes": ("capacity_bytes", "The tier's byte budget (capacity_bytes)."),
    "entries": ("entries", "Blocks the tier's budget holds."),
}
#: The budget's counters, by their name in ``capacity_stats()``.
CAPACITY_COUNTERS = {
    "evictions": ("evictions_total", "Blocks the budget evicted."),
    "evicted_bytes": ("evicted_bytes_total", "Bytes of the blocks the budget evicted."),
    "reconciles": ("reconciles_total", "Reconciles of the budget with the directory."),
    "adopted": ("reconcile_adopted_total", "Blocks other processes wrote, counted by a reconcile."),
    "forgotten": ("reconcile_forgotten_total", "Blocks other processes deleted, forgotten by a reconcile."),
}
#: The lookups' counters, by their name in ``Lookup.stats()``.
LOOKUP_COUNTERS = {
    "hits": ("lookup_hits_total", "Lookups kvtier answered hit."),
    "misses": ("lookup_misses_total", "Lookups kvtier answered miss."),
    "timeouts": ("lookup_timeouts_total", "Lookup groups past lookup_timeout (their keys missed)."),
}
#: Counters the tier keeps itself.
TRANSFER_COUNTERS = {
    "load_bytes": ("load_bytes_total", "Bytes loaded from the tier."),
    "load_failures": ("load_failures_total", "Blocks that failed to load from the tier (recomputed)."),
    "store_bytes": ("store_bytes_total", "Bytes stored in the tier."),
    "store_failures": ("store_failures_total", "Blocks whose store in the tier failed."),
    "shutdown_dropped": ("shutdown_dropped_total", "Stores and loads the tier dropped at its shutdown."),
}
VERDICT_SECONDS = PREFIX + "lookup_verdict_seconds"
VERDICT_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Every figure's definition, as vLLM's offloading metrics take them."""
    definitions: dict[str, OffloadingMetricMetadata] = {}
    for name, doc in CAPACITY_GAUGES.values():
        definitions[PREFIX + name] = OffloadingGaugeMetadata(documentation=doc, labelnames=LABELS)
    for table in (CAPACITY_COUNTERS, LOOKUP_COUNTERS, TRANSFER_COUNTERS):
        for name, doc in table.values():
            definitions[PREFIX + name] = OffloadingCounterMetadata(documentation=doc, labelnames=LABELS)
    definitions[VERDICT_SECONDS] = OffloadingHistogramMetadata(
        documentation="Time from the flush that submitted a lookup group to its verdict, in seconds.",
        labelnames=LABELS,
        buckets=VERDICT_BUCKETS,
    )
    return definitions


class Figures:
    """One source of kvtier's figures (a tier, a connector's side): turns
    its running totals into vLLM's stats payload, gauges as they are and
    counters as their increase since the last report. vLLM asks once per
    engine step; a report reads two native snapshots (tens of
    microseconds), so the figures on /metrics are never older than the
    engine's last step."""

    def __init__(self, label: str) -> None:
        self._label = (label,)
        self._reported: dict[str, float] = {}
        #: Totals kept by the caller (``TRANSFER_COUNTERS``' keys).
        self.totals: dict[str, float] = dict.fromkeys(TRANSFER_COUNTERS, 0)

    def report(
        self,
        capacity: Optional[dict[str, int]] = None,
        lookups: Optional[dict[str, int]] = None,
        verdict_seconds: Optional[list[float]] = None,
    ) -> Optional[OffloadingConnectorStats]:
        """The payload of one report; ``None`` when it would be empty."""
        stats = OffloadingConnectorStats()
        if capacity is not None:
            for key, (name, _) in CAPACITY_GAUGES.items():
                stats.set_gauge(PREFIX + name, capacity[key], self._label)
            self._increase(stats, CAPACITY_COUNTERS, capacity)
        if lookups is not None:
            self._increase(stats, LOOKUP_COUNTERS, lookups)
        self._increase(stats, TRANSFER_COUNTERS, self.totals)
        for seconds in verdict_seconds or ():
            stats.observe_histogram(VERDICT_SECONDS, seconds, self._label)
        return None if stats.is_empty() else stats

    def _increase(self, stats: OffloadingConnectorStats, table: dict, totals: dict) -> None:
        for key, (name, _) in table.items():
            total = totals.get(key, 0)
            # guard: N17-counters-report-their-increase
            increase = total - self._reported.get(key, 0)
            if increase > 0:
                stats.increase_counter(PREFIX + name, increase, self._label)
                self._reported[key] = total


def lookup_figures(lookup: Any) -> tuple[Optional[dict[str, int]], list[float]]:
    """A native ``Lookup``'s counters and the verdict times taken since the
    last call; ``(None, [])`` once it is shut down."""
    try:
        seconds, _dropped = lookup.take_verdict_times()
        return lookup.stats(), seconds
    except Exception:  # shut down (or made before a fork): nothing to say
        return None, []


class KvtierPromMetrics(KVConnectorPromMetrics):
    """kvtier's figures as Prometheus metrics for vLLM's
    ``build_prom_metrics``: registers every definition of
    ``metric_definitions()`` per engine and records the payload of
    ``OffloadingConnectorStats`` reports."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._kinds: dict[str, str] = {}
        self._metrics: dict[str, Any] = {}
        self._bound: dict[tuple[int, str, tuple[str, ...]], Any] = {}
        for name, meta in metric_definitions().items():
            kwargs: dict[str, Any] = {
                "name": name,
                "documentation": meta.documentation,
                "labelnames": labelnames + list(meta.labelnames),
            }
            if isinstance(meta, OffloadingHistogramMetadata):
                make, kind = self._histogram_cls, "histogram"
                kwargs["buckets"] = meta.buckets
            elif isinstance(meta, OffloadingGaugeMetadata):
                make, kind = self._gauge_cls, "gauge"
            else:
                make, kind = self._counter_cls, "counter"
            self._kinds[name] = kind
            self._metrics[name] = make(**kwargs)

    def _labelled(self, name: str, labelvalues: tuple[str, ...], engine: int) -> Any:
        key = (engine, name, labelvalues)
        metric = self._bound.get(key)
        if metric is None:
            values = list(self.per_engine_labelvalues[engine]) + list(labelvalues)
            metric = self._bound[key] = self._metrics[name].labels(*values)
        return metric

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = transfer_stats_data.get("data", {})
        for name, by_labels in data.items():
            kind = self._kinds.get(name)
            if kind is None:
                continue  # not one of kvtier's
            for labelvalues, value in by_labels.items():
                metric = self._labelled(name, tuple(labelvalues), engine_idx)
                if kind == "counter":
                    metric.inc(value)
                elif kind == "gauge":
                    metric.set(value)
                else:
                    for sample in value:
                        metric.observe(sample)
