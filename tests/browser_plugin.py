"""A headless Chromium driven by Selenium for the browser tests (tests/browser/), set up if missing.

If /usr/bin/chromium or /usr/bin/chromedriver is missing, Debian's chromium and chromium-driver
are installed with apt (root only), as tests/docker_plugin.py does for Docker. Selenium itself
comes from PyPI. Without them the tests skip with a hint, or fail when MURALIST_REQUIRE_BROWSER=1
(CI). Each setup step's duration is printed in the terminal summary.

Nothing is downloaded at test time: the driver's path is handed to Selenium, which then skips
Selenium Manager (the tool that would fetch a driver and a browser build). To make sure it stays
that way, SE_OFFLINE=true and an SE_MANAGER_PATH that does not exist are set while a browser
starts: were Selenium Manager ever run, it would fail at once instead of reaching out.
Chromium's own background traffic (updates, sync, field trials) is turned off by its flags;
the machines' closed network would refuse it, and the test would wait on it.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import apt, summary_plugin

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_PACKAGES = ("chromium", "chromium-driver")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    # Debian's launcher adds this only when /dev/shm is small, and its check breaks where findmnt
    # prints two lines; a container's 64 MiB /dev/shm otherwise crashes the renderer.
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)
SELENIUM_ENV = {"SE_OFFLINE": "true", "SE_MANAGER_PATH": "/nonexistent/selenium-manager"}
SUMMARY_SECTION = "setup step timings (browser)"


def timed(config: pytest.Config, step: str) -> AbstractContextManager[None]:
    """Add the block's duration to `step` in the run's summary (a browser start repeats per test)."""
    return summary_plugin.timed(config, SUMMARY_SECTION, step)


def unavailable(reason: str, module: bool = False) -> None:
    if os.environ.get("MURALIST_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (MURALIST_REQUIRE_BROWSER=1)", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


SELENIUM_MISSING = "selenium is not installed: pip install selenium (the browser tests drive Chromium with it)"


def require_selenium() -> None:
    """For a test module's top, before it imports selenium: skip it (or fail, when required) with a hint."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        unavailable(SELENIUM_MISSING, module=True)


def install_chromium(config: pytest.Config) -> None:
    hint = f"apt-get install {' '.join(APT_PACKAGES)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        unavailable(f"no {CHROMIUM} or {CHROMEDRIVER}, and they cannot be installed here (needs root and "
                    f"apt-get): {hint}")
    with timed(config, f"apt-get install {' '.join(APT_PACKAGES)}"):
        failed = apt.install(APT_PACKAGES)
    if failed:
        unavailable(failed)


def version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"\d+\.\d+\.\d+\.\d+", out)
    return found.group(0) if found else out.strip()


@dataclass(frozen=True)
class Chromium:
    """The browser and its driver, checked to be of one build (chromedriver refuses others)."""

    binary: Path
    driver: Path
    version: str


@pytest.fixture(scope="session")
def chromium(pytestconfig: pytest.Config) -> Chromium:
    try:
        import selenium  # noqa: F401
    except ImportError:
        unavailable(SELENIUM_MISSING)
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        install_chromium(pytestconfig)
        if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
            unavailable(f"{' '.join(APT_PACKAGES)} installed, yet {CHROMIUM} or {CHROMEDRIVER} is missing")
    browser, driver = version(CHROMIUM), version(CHROMEDRIVER)
    if browser != driver:
        unavailable(f"chromium {browser} and chromedriver {driver} differ: apt-get install {' '.join(APT_PACKAGES)}")
    return Chromium(CHROMIUM, CHROMEDRIVER, browser)


@pytest.fixture
def browser(chromium: Chromium, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    """A fresh headless Chromium (its own profile) whose console is readable with get_log("browser")."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for name, value in SELENIUM_ENV.items():
        monkeypatch.setenv(name, value)
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium.binary)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with timed(pytestconfig, "start chromium + chromedriver"):
        driver = webdriver.Chrome(service=Service(executable_path=str(chromium.driver)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test leaves files for people (screenshots): $MURALIST_TEST_ARTIFACTS/<test>, else tmp_path."""
    base = os.environ.get("MURALIST_TEST_ARTIFACTS")
    if not base:
        return tmp_path
    folder = Path(base) / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# -- a static file server ----------------------------------------------------------------------


@dataclass
class StaticServer:
    """A folder served on 127.0.0.1; `failures` lists the requests answered with an error."""

    url: str
    failures: list[str] = field(default_factory=list)


class _Handler(http.server.SimpleHTTPRequestHandler):
    server_record: StaticServer

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        if isinstance(code, int) and code >= 400:
            self.server_record.failures.append(f"{code} {self.path}")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: failures are recorded above, and pytest shows what a test asserts


@contextmanager
def serve(folder: Path) -> Iterator[StaticServer]:
    """Serve `folder` over HTTP on a free port of 127.0.0.1, from a thread, until the block ends."""
    record = StaticServer(url="")
    handler = functools.partial(type("Handler", (_Handler,), {"server_record": record}), directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    record.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, name="static-server", daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
