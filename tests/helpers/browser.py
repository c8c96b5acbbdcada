"""Headless Chromium for the viewer's browser tests and its bench: Debian's chromium and
chromium-driver (`make test-browser` installs them), driven by selenium; nothing is downloaded."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1600,1000")


def missing() -> str:
    """Why the browser cannot run here ('' when it can)."""
    for path in (CHROMIUM, DRIVER):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{path} is missing: `make test-browser` installs chromium and chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: `make test-browser` installs it"
    return ""


@contextlib.contextmanager
def chromium():
    """A fresh headless Chromium (its own profile directory) with its console log kept."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mopd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER if Path(DRIVER).exists()
                                                                else shutil.which("chromedriver")))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(driver) -> list:
    """The console's messages at level SEVERE since the last call (errors, failed loads)."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def wait_for(driver, script: str, timeout: float = 30.0):
    """Run ``script`` (a JavaScript expression) until it is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(f"return {script}"))
