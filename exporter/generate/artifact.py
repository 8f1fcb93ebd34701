"""`Artifact`: one generated file, as every generator returns it and `plimsoll generate` writes or checks it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the output directory, e.g. "rules/plimsoll.rules.yaml"
    text: str
