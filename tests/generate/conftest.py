"""Fixtures shared by the generate tests: the real Prometheus tools.

promtool, prometheus, amtool and alertmanager come from Debian's packages through
deploy/local/fetch-prometheus-tools.sh (into .cache/prometheus-tools); the tests that run them skip only when that
script says this machine cannot have them (exit 3: no apt-get or dpkg, or the packages are not in its apt sources).
"""

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = ROOT / "deploy" / "local" / "fetch-prometheus-tools.sh"
TOOLS_DIR = ROOT / ".cache" / "prometheus-tools"
CANNOT_FETCH = 3  # the script's exit status when this machine cannot have the tools


@pytest.fixture(scope="session")
def prometheus_tools() -> dict[str, str]:
    """The four binaries' paths, fetched on first use; the versions the script printed under "versions"."""
    result = subprocess.run(
        ["bash", str(FETCH_SCRIPT), str(TOOLS_DIR)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    if result.returncode == CANNOT_FETCH:
        reason = f"promtool/amtool cannot be had on this machine: {result.stderr.strip()}"
        print(reason)
        pytest.skip(reason)
    assert result.returncode == 0, f"fetch-prometheus-tools.sh failed:\n{result.stdout}\n{result.stderr}"
    bin_dir = TOOLS_DIR / "usr" / "bin"
    tools = {name: str(bin_dir / name) for name in ("promtool", "prometheus", "amtool", "alertmanager")}
    return {**tools, "versions": result.stdout}


def promtool_rule_tests(promtool: str, workdir: Path, unit: dict[str, Any]) -> None:
    """Run `promtool test rules` on one unit-test document (its rule_files relative to `workdir`); fail with its
    output when any test in it fails."""
    (workdir / "unit.yaml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "unit.yaml"], cwd=workdir, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
