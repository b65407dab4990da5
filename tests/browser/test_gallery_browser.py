"""The gallery in a real browser (headless Chromium): media load, videos play, links navigate.

A small but real output folder: PNGs (one with a quote, a '#' and a '%' in its name), an input
image and mask, a failed item, an H.264 mp4 with its poster, an animated WebP and GIF made by
muralist_runtime.outputs.media, and an item kept in a WebDataset shard; two items a page, so four pages.
The unit tests check the HTML; these check what only a browser can: that every URL resolves
(served, and opened from disk), that the mp4 decodes, that the script-filled totals appear.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from muralist_runtime.outputs import media
from muralist_runtime.outputs.gallery import write_gallery
from PIL import Image, ImageDraw

from tests.browser_plugin import StaticServer, require_selenium, serve

require_selenium()  # a skip with a hint, or a failure with MURALIST_REQUIRE_BROWSER=1, not an ImportError
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

FPS = 8
WAIT = 30  # seconds: a cold Chromium on two shared cores is slow to decode its first video
ODD_NAME = 'images/00002-000 "quoted" #1 50%.png'
T = TypeVar("T")


def frames(n: int = 8, size: int = 64) -> np.ndarray:
    """Moving colour gradients, floats in [0, 1] like diffusers' output_type="np"."""
    t = np.arange(n)[:, None, None, None]
    y = np.arange(size)[None, :, None, None]
    x = np.arange(size)[None, None, :, None]
    c = np.arange(3)
    return ((np.sin((x + 4 * t) / 9 + c) + np.cos((y - 3 * t) / 11 + 2 * c)) / 4 + 0.5).astype(np.float32)


def image(size: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    corners = rng.integers(0, 256, (2, 2, 3)).astype(np.uint8)
    return Image.fromarray(corners).resize((size, size), Image.Resampling.BILINEAR)


def build_output(root: Path) -> list[dict[str, Any]]:
    """Files as the runtime writes them, and their manifest lines in display order."""
    for sub in ("images", "videos", "inputs"):
        (root / sub).mkdir(parents=True)
    image(128, 0).save(root / "images/00000-000.png")
    image(48, 10).save(root / "inputs/00000-000.png")
    mask = Image.new("L", (48, 48), 0)
    ImageDraw.Draw(mask).ellipse((12, 8, 40, 36), fill=255)
    mask.save(root / "inputs/00000-000-mask.png")
    clip = frames()
    (root / "videos/00001-000.mp4").write_bytes(media.encode_video(clip, FPS, "mp4"))
    media.poster_frame(clip).save(root / "videos/00001-000.poster.png")
    image(128, 2).save(root / "images/00002-000.png")
    image(128, 3).save(root / ODD_NAME)
    (root / "videos/00005-000.webp").write_bytes(media.encode_video(clip, FPS, "webp"))
    (root / "videos/00006-000.gif").write_bytes(media.encode_video(clip, FPS, "gif"))
    common = {"negativePrompt": "blurry", "seconds": 0.42}
    return [
        {"key": "00000-000", "index": 0, "id": "row-7", "prompt": "a lighthouse at dusk, <oil> & \"ink\"", "seed": 0,
         "status": "rendered", "file": "images/00000-000.png", "kind": "image", "input": "inputs/00000-000.png",
         "mask": "inputs/00000-000-mask.png", **common},
        {"key": "00001-000", "index": 1, "prompt": "waves rolling in, slow pan", "seed": 1, "status": "rendered",
         "file": "videos/00001-000.mp4", "kind": "video", "poster": "videos/00001-000.poster.png", "fps": FPS,
         "frames": len(clip), **common},
        {"key": "00002-000", "index": 2, "prompt": "a red fox in snow", "seed": 2, "status": "skipped",
         "file": "images/00002-000.png", "kind": "image"},
        {"key": "00003-000", "index": 3, "prompt": "a city <script>alert(1)</script>", "seed": 3, "status": "failed",
         "error": "CUDA out of memory. Tried to allocate 2.00 GiB"},
        {"key": "00004-000", "index": 4, "prompt": "a file name with quotes", "seed": 4, "status": "rendered",
         "file": ODD_NAME, "kind": "image"},
        {"key": "00005-000", "index": 5, "prompt": "an animated webp", "seed": 5, "status": "rendered",
         "file": "videos/00005-000.webp", "kind": "video", "fps": FPS, "frames": len(clip)},
        {"key": "00006-000", "index": 6, "prompt": "an animated gif", "seed": 6, "status": "rendered",
         "file": "videos/00006-000.gif", "kind": "video", "fps": FPS, "frames": len(clip)},
        {"key": "00007-000", "index": 7, "prompt": "kept in a shard", "seed": 7, "status": "rendered",
         "shard": "shards/shard-000000.tar"},
    ]


CAPTION = {"model": "muralist/tiny-flux", "scheduler": "FlowMatchEulerDiscreteScheduler",
           "adapters": [{"name": "watercolor-lora", "scale": 0.8}], "strategy": "data-parallel"}


@pytest.fixture(scope="module")
def gallery(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("output")
    write_gallery(root, "Coastal <study>", build_output(root), page_size=2, caption=CAPTION)
    return root


@pytest.fixture(scope="module")
def server(gallery: Path) -> Iterator[StaticServer]:
    with serve(gallery) as running:
        yield running


def wait_for(driver: WebDriver, what: str, condition: Callable[[WebDriver], T]) -> T:
    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(condition, f"timed out waiting for {what}")


# Scrolls each lazy image into view (so the browser fetches it) and lists those not yet decoded.
PENDING_IMAGES = """
return Array.from(document.images).filter(function (img) {
  if (img.complete && img.naturalWidth > 0) return false;
  img.scrollIntoView({block: "center"});
  return true;
}).map(function (img) { return img.getAttribute("src"); });
"""
# HAVE_CURRENT_DATA (2) means a frame decoded; currentTime > 0 that autoplay really runs.
VIDEO_STATE = """
return Array.from(document.querySelectorAll("video")).map(function (v) {
  return {src: v.getAttribute("src"), readyState: v.readyState, time: v.currentTime,
          error: v.error && (v.error.code + ": " + v.error.message)};
});
"""


def check_page(driver: WebDriver, server: StaticServer | None = None) -> dict[str, int]:
    """Every image decoded, every video playing, nothing on the console: the page's counts."""
    wait_for(driver, "the page to load", lambda d: d.execute_script("return document.readyState") == "complete")
    wait_for(driver, "every <img> to load", lambda d: not d.execute_script(PENDING_IMAGES))

    def playing(d: WebDriver) -> bool:
        videos = d.execute_script(VIDEO_STATE)
        assert not [v for v in videos if v["error"]], f"a video failed to decode: {videos}"
        return all(v["readyState"] >= 2 and v["time"] > 0 for v in videos)

    wait_for(driver, "every <video> to decode and play", playing)
    severe = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, f"console errors on {driver.current_url}: {severe}"
    if server is not None:
        assert not server.failures, f"requests that failed: {server.failures}"
    return {"images": len(driver.find_elements(By.TAG_NAME, "img")),
            "videos": len(driver.find_elements(By.TAG_NAME, "video")),
            "cards": len(driver.find_elements(By.CSS_SELECTOR, "main > figure.card"))}


def current_page(driver: WebDriver) -> int:
    return int(driver.find_element(By.CSS_SELECTOR, "nav.pager [aria-current=page]").text)


def follow(driver: WebDriver, rel: str) -> None:
    """Click the first prev/next link and wait for the page it leads to."""
    before = current_page(driver)
    driver.find_element(By.CSS_SELECTOR, f"nav.pager a[rel={rel}]").click()
    wait_for(driver, f"the {rel} page", lambda d: d.execute_script("return document.readyState") == "complete"
             and current_page(d) == before + (1 if rel == "next" else -1))


def test_every_page_loads_its_media_and_links_navigate(browser: WebDriver, server: StaticServer,
                                                       artifacts: Path) -> None:
    started = time.monotonic()
    browser.get(server.url)
    counts = [check_page(browser, server)]
    screenshot = artifacts / "gallery-page-1.png"
    assert browser.save_screenshot(str(screenshot)), "the screenshot was not written"
    print(f"\nscreenshot of page 1: {screenshot}")
    urls = [browser.current_url]
    for _ in range(3):
        follow(browser, "next")
        urls.append(browser.current_url)
        counts.append(check_page(browser, server))
        browser.save_screenshot(str(artifacts / f"gallery-page-{current_page(browser)}.png"))
    assert urls[1:] == [f"{server.url}gallery/page-0000{n}.html" for n in (2, 3, 4)]
    assert not browser.find_elements(By.CSS_SELECTOR, "nav.pager a[rel=next]"), "the last page has no next"
    assert counts == [{"images": 3, "videos": 1, "cards": 2},  # output, input, mask; a video (its poster is no <img>)
                      {"images": 1, "videos": 0, "cards": 2},  # a skipped image, a failed card
                      {"images": 2, "videos": 0, "cards": 2},  # the odd file name, animated webp
                      {"images": 1, "videos": 0, "cards": 2}]  # animated gif, a shard's text card

    for expected in (3, 2, 1):
        follow(browser, "prev")
        assert current_page(browser) == expected
    assert browser.current_url == f"{server.url}index.html"
    print(f"4 pages checked forth and back in {time.monotonic() - started:.1f} s")


def test_cards_show_what_the_manifest_says(browser: WebDriver, server: StaticServer) -> None:
    browser.get(f"{server.url}gallery/page-00002.html")
    check_page(browser, server)
    failed = browser.find_element(By.CSS_SELECTOR, "figure.card.failed")
    assert failed.find_element(By.CSS_SELECTOR, ".prompt").text == "a city <script>alert(1)</script>"
    assert failed.find_element(By.CSS_SELECTOR, ".error").text == "CUDA out of memory. Tried to allocate 2.00 GiB"
    # Page 2 was written before the end: its total comes from gallery/summary.js.
    assert browser.find_element(By.CSS_SELECTOR, ".summary").text == (
        "Page 2: items 3\u20134 (1 skipped, 1 failed) \u00b7 8 items on 4 pages \u00b7 1 failed")
    assert browser.find_element(By.CSS_SELECTOR, ".job").text == (
        "model muralist/tiny-flux \u00b7 scheduler FlowMatchEulerDiscreteScheduler \u00b7 adapter watercolor-lora "
        "\u00d70.8 \u00b7 strategy data-parallel")
    assert browser.title == "Coastal <study> \u00b7 page 2 \u00b7 Muralist"


def test_the_folder_works_opened_from_disk(browser: WebDriver, gallery: Path) -> None:
    """file:// as after `kubectl cp`: relative links, percent-encoded names and summary.js work."""
    browser.get((gallery / "index.html").as_uri())
    check_page(browser)
    for n in (2, 3, 4):
        follow(browser, "next")
        check_page(browser)
        assert browser.current_url == (gallery / f"gallery/page-0000{n}.html").as_uri()
    browser.get((gallery / "gallery/page-00002.html").as_uri())
    assert browser.find_element(By.CSS_SELECTOR, ".summary").text.endswith("8 items on 4 pages \u00b7 1 failed")


def test_an_early_page_links_the_last_page_once_summary_js_loads(browser: WebDriver, tmp_path: Path) -> None:
    entries = ({"key": f"{i:05d}-000", "status": "failed", "error": f"error {i}"} for i in range(10))
    write_gallery(tmp_path, "ten pages", entries, page_size=1)
    with serve(tmp_path) as server:
        browser.get(f"{server.url}gallery/page-00002.html")
        check_page(browser, server)
        pager = browser.find_element(By.CSS_SELECTOR, "nav.pager")
        assert [e.text for e in pager.find_elements(By.CSS_SELECTOR, "a, span:not(.tail)")] == [
            "\u2039 prev", "1", "2", "3", "4", "\u2026", "10", "next \u203a"]
        pager.find_element(By.LINK_TEXT, "10").click()
        wait_for(browser, "the last page", lambda d: d.current_url.endswith("/gallery/page-00010.html"))
        check_page(browser, server)
        assert current_page(browser) == 10
