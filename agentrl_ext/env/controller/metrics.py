"""Prometheus metrics of the controller (served at ``GET /metrics``).

Each controller owns its registry, so several controllers can live in one process (tests).
Label values are bound once per task/endpoint and cached: ``.labels()`` is the costly part of a
metric update, and the controller updates several metrics per forwarded request.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from agentrl_ext.env.protocol import SampleStatus

__all__ = ["CONTENT_TYPE", "ControllerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format, as :func:`generate_latest` writes it and every Prometheus version
reads it (what prometheus_client itself answers a scraper that asks for nothing else)."""

# Controller work is sub-millisecond; environment steps can take seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class ControllerMetrics:
    """The controller's counters, gauges and latency histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_open = Gauge("agentrl_controller_sessions_open", "Open sessions", ["task"], registry=r)
        self.sessions_started = Counter(
            "agentrl_controller_sessions_started_total", "Sessions started", ["task"], registry=r
        )
        self.sessions_finished = Counter(
            "agentrl_controller_sessions_finished_total",
            "Sessions ended, by final status (expired and worker-lost sessions included)",
            ["task", "status"],
            registry=r,
        )
        self.sessions_expired = Counter(
            "agentrl_controller_sessions_expired_total", "Sessions cancelled for idling", ["task"], registry=r
        )
        self.start_retries = Counter(
            "agentrl_controller_start_sample_retries_total",
            "start_sample attempts moved to another worker, by reason",
            ["task", "reason"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "agentrl_controller_request_duration_seconds",
            "Time from request received to answer ready, worker time included",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_seconds = Histogram(
            "agentrl_controller_worker_request_duration_seconds",
            "Time spent waiting for workers; controller overhead is request minus worker time",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.client_errors = Counter(
            "agentrl_controller_client_errors_total",
            "Requests answered 4xx, by endpoint",
            ["endpoint"],
            registry=r,
        )
        self.workers = Gauge(
            "agentrl_controller_workers", "Registered workers", ["task", "state"], registry=r
        )
        self.worker_capacity = Gauge(
            "agentrl_controller_worker_capacity",
            "Summed concurrency of healthy workers",
            ["task"],
            registry=r,
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    def session_started(self, task: str) -> None:
        """Count a started session and raise the open gauge."""
        self._child(self.sessions_started, task).inc()
        self._child(self.sessions_open, task).inc()

    def session_finished(self, task: str, status: SampleStatus) -> None:
        """Count an ended session under its final status and lower the open gauge."""
        self._child(self.sessions_finished, task, status.value).inc()
        self._child(self.sessions_open, task).dec()

    def session_expired(self, task: str) -> None:
        """Count a session cancelled for idling."""
        self._child(self.sessions_expired, task).inc()

    def start_retry(self, task: str, reason: str) -> None:
        """Count a start_sample moved to another worker."""
        self._child(self.start_retries, task, reason).inc()

    def observe(self, endpoint: str, total_s: float, worker_s: float | None) -> None:
        """Record one request's total and worker latency."""
        self._child(self.request_seconds, endpoint).observe(total_s)
        if worker_s is not None:
            self._child(self.worker_seconds, endpoint).observe(worker_s)

    def client_error(self, endpoint: str) -> None:
        """Count a 4xx answer."""
        self._child(self.client_errors, endpoint).inc()

    def set_workers(self, task: str, healthy: int, unhealthy: int, capacity: int) -> None:
        """Publish the worker census of one task."""
        self._child(self.workers, task, "healthy").set(healthy)
        self._child(self.workers, task, "unhealthy").set(unhealthy)
        self._child(self.worker_capacity, task).set(capacity)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
