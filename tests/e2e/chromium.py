"""Headless Chromium (Debian's chromium and chromium-driver) driven by selenium, for the
dashboard's page tests."""
from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def start_chromium(profile_dir):
    assert CHROMIUM and CHROMEDRIVER, "Debian's chromium and chromium-driver are needed " \
                                      "(bash scripts/setup.sh installs them)"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--window-size=1280,900",
                 f"--user-data-dir={profile_dir}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(120)
    return driver


def log_in(driver, url: str, user: str, password: str) -> None:
    """Open the page and log in through its form."""
    driver.get(url)
    wait(lambda: driver.find_element("id", "login").is_displayed(), "the login form")
    driver.find_element("id", "login-user").send_keys(user)
    driver.find_element("id", "login-password").send_keys(password)
    driver.find_element("id", "login-submit").click()
    wait(lambda: driver.find_element("id", "main").is_displayed(), "the page after logging in")
    assert not driver.find_element("id", "login").is_displayed(), "the login form stayed"


def wait(check, what: str, timeout: float = 60.0, every: float = 0.25):
    import time
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # an element not there yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
