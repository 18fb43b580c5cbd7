"""`PeerScraper`: the peer's Prometheus endpoint, read every few seconds, as `PeerMetrics`.

What is read, per data-parallel rank (vLLM labels its samples `engine="<rank>"`; SGLang is
assumed to label them `dp_rank` when it has more than one, else every sample is rank 0):

- vLLM 0.33 (`vllm/v1/metrics/loggers.py`): the counters `vllm:prefix_cache_queries` and
  `vllm:prefix_cache_hits` (tokens; exposed as `..._total`) and the gauge
  `vllm:kv_cache_usage_perc` (a fraction, 0..1, despite its name);
- SGLang: `sglang:prompt_tokens_total` as the queries (every prompt token asks the cache),
  `sglang:cached_tokens_total` summed over its `cache_source` labels as the hits, and
  `sglang:token_usage` as the usage.

Samples of one rank are summed (vLLM has one per model name). A scrape that fails or finds
none of the counters is logged (once per kind of failure) and counted, never fatal.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from attach.bridge.stats import BridgeStats
from engine.events import PeerMetrics

log = logging.getLogger("attach.bridge")

NAMES = {
    "vllm": {
        "queries": ("vllm:prefix_cache_queries",),
        "hits": ("vllm:prefix_cache_hits",),
        "usage": ("vllm:kv_cache_usage_perc",),
    },
    "sglang": {
        "queries": ("sglang:prompt_tokens",),
        "hits": ("sglang:cached_tokens",),
        "usage": ("sglang:token_usage",),
    },
}
RANK_LABELS = ("engine", "dp_rank")


def parse_metrics(text: str, flavor: str, scraped_ts: float) -> list[PeerMetrics]:
    """The `PeerMetrics` of each rank in an exposition `text` (none when it has no counter)."""
    names = NAMES[flavor]
    kind_of = {name: kind for kind, found in names.items() for name in found}
    totals: dict[int, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            kind = kind_of.get(name)
            if kind is None or sample.name.endswith(("_created", "_bucket")):
                continue
            rank_label = next((sample.labels[k] for k in RANK_LABELS if k in sample.labels), "0")
            try:
                rank = int(rank_label)
            except ValueError:
                rank = 0
            per_rank = totals.setdefault(rank, {})
            per_rank[kind] = per_rank.get(kind, 0.0) + float(sample.value)
    metrics = []
    for rank, values in sorted(totals.items()):
        if "queries" not in values or "hits" not in values:
            continue
        usage = values.get("usage")
        metrics.append(
            PeerMetrics(
                rank=rank,
                scraped_ts=scraped_ts,
                queries_tokens=max(0.0, values["queries"]),
                hits_tokens=max(0.0, values["hits"]),
                usage=None if usage is None else min(1.0, max(0.0, usage)),
            )
        )
    return metrics


class PeerScraper:
    """Scrapes `url` every `interval_s` on a thread of its own; `take()` hands the latest
    results (at most `max_held`, the oldest dropped) to the bridge's thread."""

    def __init__(
        self,
        url: str,
        flavor: str,
        stats: BridgeStats,
        interval_s: float = 5.0,
        timeout_s: float = 3.0,
        max_held: int = 64,
    ) -> None:
        self.url, self.flavor, self.stats = url, flavor, stats
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.held: collections.deque[PeerMetrics] = collections.deque(maxlen=max_held)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.last_problem: str | None = None
        self.thread = threading.Thread(target=self._run, name="peer-scraper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def take(self) -> list[PeerMetrics]:
        with self.lock:
            taken = list(self.held)
            self.held.clear()
        return taken

    def scrape_once(self, client) -> list[PeerMetrics]:
        response = client.get(self.url, timeout=self.timeout_s)
        response.raise_for_status()
        return parse_metrics(response.text, self.flavor, time.time())

    def _run(self) -> None:
        import httpx

        with httpx.Client() as client:
            while not self.stopping.is_set():
                try:
                    metrics = self.scrape_once(client)
                    problem = None if metrics else "no prefix-cache counters in the scrape"
                except Exception as exc:  # the peer away, a bad page: say it, try again
                    metrics, problem = [], f"{type(exc).__name__}: {exc}"
                self.stats.scrapes.labels("error" if problem else "ok").inc()
                if problem and problem != self.last_problem:
                    log.warning("metrics %s: %s", self.url, problem)
                elif not problem and self.last_problem:
                    log.info("metrics %s: scraping again", self.url)
                self.last_problem = problem
                with self.lock:
                    self.held.extend(metrics)
                self.stopping.wait(self.interval_s)
