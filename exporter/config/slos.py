"""The `slos` section: a latency threshold and an objective for time to first token, inter-token latency and
end-to-end latency."""

from typing import Any

from exporter.config.model import SloConfig
from exporter.config.reader import Reader
from exporter.config.validators import validate_duration, validate_ratio
from exporter.core.slo import SLO_NAMES


def parse_slos(r: Reader, raw: Any) -> tuple[SloConfig, ...]:
    data = r.mapping(raw, "slos")
    r.unknown(data, "slos", SLO_NAMES)
    slos = []
    for name in SLO_NAMES:
        if name not in data:
            continue
        entry = r.mapping(data[name], f"slos.{name}")
        r.unknown(entry, f"slos.{name}", ("threshold", "objective"))
        if entry.get("threshold") is None:
            r.fail(f"slos.{name}.threshold", "missing (a latency such as 500ms)")
        threshold = r.convert(entry, "threshold", f"slos.{name}.", validate_duration, None)
        objective = r.convert(entry, "objective", f"slos.{name}.", validate_ratio, 0.99)
        if objective == 1.0:
            r.fail(f"slos.{name}.objective", "1 leaves no error budget; use e.g. 0.999")
        if threshold is not None:
            slos.append(SloConfig(name, threshold, objective))
    return tuple(slos)
