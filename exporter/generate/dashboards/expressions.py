"""PromQL the dashboards build from the daemon's series: SLIs and burn rates from its SLO counters, what the capacity
model puts on a GPU part by part, and a per-GPU series labelled with the GPU's product name."""

from exporter.config import SloConfig
from exporter.generate.dashboards.panels import ENGINE, NODE, num


def sli(slo: SloConfig, by: str, window: str) -> str:
    """Share of requests within the SLO's threshold: good / total over `window`."""
    good = f'plimsoll_slo_good_requests_total{{{ENGINE}, slo="{slo.name}"}}'
    total = f'plimsoll_slo_requests_total{{{ENGINE}, slo="{slo.name}"}}'
    return f"sum by ({by}) (rate({good}[{window}])) / sum by ({by}) (rate({total}[{window}]))"


def burn(slo: SloConfig, by: str, window: str) -> str:
    """Error ratio over `window` divided by the error budget (1 - objective): 1 spends the budget over the period."""
    return f"(1 - ({sli(slo, by, window)})) / (1 - {num(slo.objective)})"


def modeled_parts(scope: str) -> list[tuple[str, str]]:
    """What the capacity model puts on one GPU of a target, part by part. The KV pool is capacity x bytes per token
    (exact for models whose layers share one attention kind; the daemon's unexplained figure uses the exact pool)."""
    return [
        ("weights", f"plimsoll_model_weights_bytes{{{scope}}}"),
        (
            "KV pool",
            f"plimsoll_model_kv_bytes_per_token{{{scope}}}"
            f' * ignoring (source) plimsoll_kv_cache_capacity_tokens{{{scope}, source="model"}}',
        ),
        ("activation", f"plimsoll_model_activation_bytes{{{scope}}}"),
        ("overhead", f"plimsoll_model_overhead_bytes{{{scope}}}"),
    ]


def modeled_total(scope: str) -> str:
    return " + ".join(f"({expr})" if part == "KV pool" else expr for part, expr in modeled_parts(scope))


def with_gpu_name(expr: str) -> str:
    """Label a per-GPU series with the GPU's product name from plimsoll_gpu_info."""
    return (
        f"max by (instance, gpu, name) ({expr}"
        f" * on (instance, gpu) group_left (name) max by (instance, gpu, name) (plimsoll_gpu_info{{{NODE}}}))"
    )
