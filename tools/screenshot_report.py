"""Screenshot of an HTML report in headless Chromium, with the tooltip of the
first divergence shown (the README's picture):

    python tools/screenshot_report.py report.html docs/report.png
"""
from __future__ import annotations

import shutil
import sys

from playwright.sync_api import sync_playwright


def main(src: str, out: str) -> None:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1280, "height": 1000})
        page.goto("file://" + __import__("os").path.abspath(src))
        page.wait_for_function("window.kdReady !== undefined")
        page.click("#zoom-root")
        x, y = page.evaluate("""() => { const k = RUNS.findIndex(r => r.marks.length), r = RUNS[k], i = r.marks[0],
            cv = document.getElementById('timeline').getBoundingClientRect(), PW = TL.width - 62;
            return [cv.left + 56 + (i - TL.x0) / (TL.span / PW) + 1, cv.top + 24 + k * TL.rowH + 14]; }""")
        page.mouse.move(x, y)
        page.locator("#tooltip").wait_for(state="visible")
        page.screenshot(path=out)
        b.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
