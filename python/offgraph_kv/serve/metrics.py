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

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"offgraph_kv_{name}", doc, registry=r)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"offgraph_kv_{name}", doc, labels, registry=r)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(f"offgraph_kv_{name}", doc, buckets=_LATENCY, registry=r)

        self.requests = counter(
            "requests",
            "Requests (choices) by outcome: finished, cancelled, rejected, error",
            ("outcome",),
        )
        self.running = gauge("requests_running", "Requests in the batch")
        self.waiting = gauge(
            "requests_waiting",
            "Requests queued for their first token (the admission queue's depth)",
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests")
        self.cached_tokens = counter(
            "cached_tokens", "Prompt tokens served from shared cells instead of being computed"
        )
        self.generated_tokens = counter("generated_tokens", "Tokens generated")
        self.cells_used = gauge("cells_used", "Cells in use")
        self.cells_free = gauge("cells_free", "Free cells")
        self.cells_cached = gauge(
            "cells_cached",
            "Cells in use that no running request wrote: prefix cache and shared prompts",
        )
        self.pool_committed_bytes = gauge(
            "pool_committed_bytes",
            "Memory the K/V pools have committed: resident pages of reserved pools, the heap "
            "buffers of grown ones (updated between steps, at most every second while busy)",
        )
        self.resident_bytes = gauge(
            "process_resident_bytes", "The server process's resident memory, read at scrape time"
        )
        self.resident_bytes.set_function(resident_bytes)
        self.host_cache_bytes = gauge(
            "host_cache_bytes",
            "Bytes of K/V chunks the host tier holds (prompts evicted from the cells)",
        )
        self.host_cache_hits = counter(
            "host_cache_hits", "Admissions whose prompt prefix the host tier restored"
        )
        self.host_cache_evictions = counter(
            "host_cache_evictions",
            "Chunks the host tier dropped for room (least recently used first)",
        )
        self.host_cache_tokens_restored = counter(
            "host_cache_tokens_restored",
            "Prompt tokens restored from the host tier instead of being computed",
        )
        self._host_seen: dict[str, int] = {}
        self.spec_drafted_tokens = counter(
            "spec_drafted_tokens", "Tokens drafted by speculative decoding (serve --spec)"
        )
        self.spec_accepted_tokens = counter(
            "spec_accepted_tokens", "Drafted tokens the model's own sampling accepted"
        )
        self.spec_acceptance_rate = gauge(
            "spec_acceptance_rate", "Accepted over drafted tokens since the server started"
        )
        self.step_seconds = histogram("step_seconds", "Time of one generator step")
        self.ttft_seconds = histogram(
            "time_to_first_token_seconds", "Time from admission to a request's first token"
        )

    def speculation(self, stats: dict) -> None:
        """Publishes a generator's ``spec_*`` stats (counters by their increase)."""
        for key, counter in (
            ("spec_drafted_tokens", self.spec_drafted_tokens),
            ("spec_accepted_tokens", self.spec_accepted_tokens),
        ):
            now = int(stats.get(key, 0))
            if now > self._host_seen.get(key, 0):
                counter.inc(now - self._host_seen.get(key, 0))
            self._host_seen[key] = now
        self.spec_acceptance_rate.set(float(stats.get("spec_acceptance_rate", 0.0)))

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
