"""A screenshot of the dashboard during the fairness benchmark's WFQ run (README, docs).

Starts a node as ``fairness.py`` does for ``--policy wfq --tenant-weights a=3,b=1``, runs its
two classes of closed-loop clients, opens ``/dashboard`` in headless Chromium (Debian's
``chromium``), and after ``--after`` seconds clicks the widest bar (its timeline shows) and
saves the page to ``--out``.

    .venv/bin/python bench/dashboard_screenshot.py [--seconds 40] [--after 30]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from common import ROOT, start_node
from fairness import POLICIES, saturate

from tests.integration.browser import Browser


async def shoot(url: str, args: argparse.Namespace) -> None:
    browser = await Browser(Path(tempfile.mkdtemp(prefix="tinyserve-shot-"))).start(1280, 1000)
    try:
        await browser.goto(f"{url}/dashboard")
        await browser.until("document.getElementById('status').textContent === 'live'")
        load = asyncio.ensure_future(saturate(url, args.clients, args.seconds, args.max_tokens))
        await asyncio.sleep(args.after)
        for _ in range(5):  # a saturated engine may miss the timeline query's 1 s limit
            if await show_a_timeline(browser):
                break
        await browser.screenshot(args.out)
        print(f"wrote {args.out}")
        await load
    finally:
        await browser.close()


async def show_a_timeline(browser: Browser) -> bool:
    """Click the widest bar; whether its timeline came (rather than an error)."""
    box = await browser.evaluate(
        "(() => { const bars = [...document.querySelectorAll('#slots rect.bar')];"
        " bars.sort((a, b) => b.getBoundingClientRect().width"
        " - a.getBoundingClientRect().width);"
        " const r = bars[0].getBoundingClientRect();"
        " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
    )
    await browser.click(box["x"], box["y"])
    await browser.until("document.getElementById('timeline').textContent !== 'loading…'")
    shown = await browser.evaluate("Boolean(document.querySelector('#timeline dl'))")
    if not shown:
        print(
            "no timeline:",
            await browser.evaluate("document.getElementById('timeline').textContent"),
        )
    return bool(shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="length of the load")
    parser.add_argument("--after", type=float, default=30.0, help="screenshot after this long")
    parser.add_argument("--clients", type=int, default=16, help="clients per class")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard.png")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    flags = ("--policy", "wfq", *POLICIES["wfq"], "--max-queue", "256")
    node = start_node(*flags, frontends=2)
    try:
        asyncio.run(shoot(node.url, args))
    finally:
        node.stop(check=False)


if __name__ == "__main__":
    main()
