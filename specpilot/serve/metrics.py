"""/metrics in Prometheus' text format: requests by outcome, tokens, time to first token, tokens per target pass,
and gauges read from the engine thread's counts when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

PREFIX = "specpilot"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ACCEPT_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


class Metrics:
    """One server's metrics; `stats`: the engine thread's counts (serve/worker.Stats)."""

    def __init__(self, stats, model: str):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Requests answered, by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of the requests served", registry=r)
        self.output_tokens = Counter(f"{PREFIX}_output_tokens", "Tokens of the requests finished", registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "From a request's arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.accept = Histogram(f"{PREFIX}_accept_length", "A request's tokens per target pass (1 for AR)",
                                buckets=ACCEPT_BUCKETS, registry=r)
        r.register(_Live(stats, model))

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _Live:
    """Gauges read at each scrape from the engine thread's counts."""

    def __init__(self, stats, model: str):
        self.stats, self.model = stats, model

    def collect(self):
        s = self.stats
        for name, doc, value in (
                ("requests_in_flight", "Requests holding a slot", s.in_flight),
                ("queue_depth", "Requests waiting for a slot", s.waiting),
                ("output_tokens_per_second", "Tokens generated a second, over the last 10 s", s.tokens_per_s()),
                ("mean_accept_length", "Decode tokens per target pass of a request, since start",
                 s.decoded / s.passes if s.passes else 0.0)):
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["model"])
            family.add_metric([self.model], value)
            yield family
