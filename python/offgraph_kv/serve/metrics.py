"""Prometheus metrics of one server (its own registry, so two apps in a process never clash)."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


def resident_bytes() -> float:
    """The process's resident memory (``/proc/self/statm``); NaN where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return float(pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return float("nan")


_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)


class Metrics:
    """The names DESIGN.md lists, all prefixed ``offgraph_kv_``."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "offgraph_kv_requests",
            "Requests (choices) by outcome: finished, cancelled, rejected, error",
            ["outcome"],
            registry=r,
        )
        self.running = Gauge("offgraph_kv_requests_running", "Requests in the batch", registry=r)
        self.waiting = Gauge(
            "offgraph_kv_requests_waiting",
            "Requests queued for their first token (the admission queue's depth)",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "offgraph_kv_prompt_tokens", "Prompt tokens of admitted requests", registry=r
        )
        self.cached_tokens = Counter(
            "offgraph_kv_cached_tokens",
            "Prompt tokens served from shared cells instead of being computed",
            registry=r,
        )
        self.generated_tokens = Counter(
            "offgraph_kv_generated_tokens", "Tokens generated", registry=r
        )
        self.cells_used = Gauge("offgraph_kv_cells_used", "Cells in use", registry=r)
        self.cells_free = Gauge("offgraph_kv_cells_free", "Free cells", registry=r)
        self.cells_cached = Gauge(
            "offgraph_kv_cells_cached",
            "Cells in use that no running request wrote: prefix cache and shared prompts",
            registry=r,
        )
        self.pool_committed_bytes = Gauge(
            "offgraph_kv_pool_committed_bytes",
            "Memory the K/V pools have committed: resident pages of reserved pools, the heap "
            "buffers of grown ones (updated between steps, at most every second while busy)",
            registry=r,
        )
        self.resident_bytes = Gauge(
            "offgraph_kv_process_resident_bytes",
            "The server process's resident memory, read at scrape time",
            registry=r,
        )
        self.resident_bytes.set_function(resident_bytes)
        self._host_cache(r)
        self.step_seconds = Histogram(
            "offgraph_kv_step_seconds", "Time of one generator step", buckets=_LATENCY, registry=r
        )
        self.ttft_seconds = Histogram(
            "offgraph_kv_time_to_first_token_seconds",
            "Time from admission to a request's first token",
            buckets=_LATENCY,
            registry=r,
        )

    def _host_cache(self, r: CollectorRegistry) -> None:
        self.host_cache_bytes = Gauge(
            "offgraph_kv_host_cache_bytes",
            "Bytes of K/V chunks the host tier holds (prompts evicted from the cells)",
            registry=r,
        )
        self.host_cache_hits = Counter(
            "offgraph_kv_host_cache_hits",
            "Admissions whose prompt prefix the host tier restored",
            registry=r,
        )
        self.host_cache_evictions = Counter(
            "offgraph_kv_host_cache_evictions",
            "Chunks the host tier dropped for room (least recently used first)",
            registry=r,
        )
        self.host_cache_tokens_restored = Counter(
            "offgraph_kv_host_cache_tokens_restored",
            "Prompt tokens restored from the host tier instead of being computed",
            registry=r,
        )
        self._host_seen: dict[str, int] = {}

    def host_cache(self, stats: dict) -> None:
        """Publishes a generator's ``host_cache_*`` stats (counters by their increase)."""
        if "host_cache_bytes" not in stats:
            return
        self.host_cache_bytes.set(stats["host_cache_bytes"])
        for key, counter in (
            ("host_cache_hits", self.host_cache_hits),
            ("host_cache_evictions", self.host_cache_evictions),
            ("host_cache_tokens_restored", self.host_cache_tokens_restored),
        ):
            now = int(stats.get(key, 0))
            if now > self._host_seen.get(key, 0):
                counter.inc(now - self._host_seen.get(key, 0))
            self._host_seen[key] = now
