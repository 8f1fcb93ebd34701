"""Regenerate docs/status-page.png, the README's picture of the status page, over a recorded fleet.

    .venv/bin/python -m deploy.local.screenshot_status [--out docs/status-page.png]

The fleet is tests/support/recorded_fleet.py's node A, all on 127.0.0.1: real daemons polling recorded engine
pages (vLLM saturated, a burst replayed idle -> peak -> after, one that preempted, SGLang, a target whose port
refuses) with recorded H100 GPUs as NVML. The browser is Debian's headless chromium (deploy/local/install-browser.sh),
with everything but loopback refused. Takes about 20 s.
"""

import argparse
import time
from pathlib import Path

from selenium.webdriver.support.ui import WebDriverWait

from exporter.config import Config
from tests.support.browser import headless_chromium, install
from tests.support.recorded_fleet import recorded_fleet

ROOT = Path(__file__).resolve().parents[2]

# The replayed burst moves a stage this often, so the sparklines have a shape.
STAGE_SECONDS = 4.0
WIDTH = 1440
PAGE_TIMEOUT_SECONDS = 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "status-page.png")
    args = parser.parse_args()
    install()
    with recorded_fleet(Config()) as fleet:
        # Polls every 0.5 s: a few seconds per stage gives each a handful of points in the history.
        for _ in range(2):
            time.sleep(STAGE_SECONDS)
            fleet.advance("vllm-1gib-burst")
            fleet.advance("vllm-2mib-preempting")
        time.sleep(STAGE_SECONDS)
        with headless_chromium(WIDTH, 900) as browser:
            browser.get(f"http://{fleet.node_a}/")
            WebDriverWait(browser, PAGE_TIMEOUT_SECONDS).until(
                lambda driver: driver.execute_script("return document.getElementById('age').textContent"),
                "the page's script did not read /api/v1/state",
            )
            height = browser.execute_script("return Math.ceil(document.body.getBoundingClientRect().bottom) + 16;")
            # The viewport itself (not the window around it) as tall as the page, so the picture has all of it.
            browser.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(str(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
