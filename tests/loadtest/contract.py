"""result.json's contract for `knee`, the fields scripts read, written out here rather than taken from
exporter.loadtest.outputs, so a key dropped from the code fails the tests instead of changing what they expect."""

KNEE_KEYS = frozenset(
    {
        "concurrency",
        "request_rate",
        "output_tokens_per_second",
        "kv_cache_usage_ratio",
        "requests_waiting",
        "ttft_p99_seconds",
        "itl_p99_seconds",
        "slo_attainment",
    }
)
