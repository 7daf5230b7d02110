"""The dashboard's page in headless Chromium against a broker process (no Kafka or Spark): the
login form, and the administrator's buttons (kick, ban, unban, delete a retained message) doing
what they say through the admin API, which the read-only role does not see."""
from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pytest

from broker.protocol import packets as P
from tests.e2e.chromium import log_in, start_chromium, wait
from tests.integration.dashboard_http import ADMIN, ADMIN_PW, VIEWER, VIEWER_PW, get_json, start_dashboard
from tests.mqtt_raw import RawClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def browser(tmp_path_factory):
    d = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield d
    finally:
        d.quit()


def _client(port: int, cid: str, disconnects: list):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
    c.on_disconnect = lambda cl, ud, flags, rc, props: disconnects.append(rc.value)
    c.connect("127.0.0.1", port)
    c.loop_start()
    return c


def _click(driver, css: str) -> None:
    """Click the button and accept its confirmation dialog."""
    wait(lambda: driver.find_element("css selector", css).is_displayed(), css)
    driver.execute_script("document.querySelector(arguments[0]).click()", css)
    wait(lambda: driver.switch_to.alert, "the confirmation dialog").accept()


def test_admin_buttons_kick_ban_unban_and_delete_retained(make_broker, tmp_path, browser):
    b = start_dashboard(make_broker, tmp_path)
    d = browser
    gone: list = []
    kept: list = []
    victim = _client(b.port, "victim-1", gone)
    other = _client(b.port, "bystander", kept)
    try:
        other.publish("plant/valve", b"open", qos=1, retain=True).wait_for_publish(5)
        log_in(d, b.dashboard + "/#clients", ADMIN, ADMIN_PW)
        assert "root (admin)" in d.find_element("id", "who").text

        # kick: the client gets DISCONNECT 0x98 Administrative action
        _click(d, 'button[data-kick="victim-1"]')
        wait(lambda: gone == [0x98], "the kicked client's DISCONNECT 0x98")
        wait(lambda: "Disconnected victim-1" in d.find_element("id", "action-message").text,
             "the page's confirmation")
        victim.loop_stop()

        # ban: disconnected, then refused at CONNECT with 0x8A Banned, listed with an Unban button
        _click(d, 'button[data-ban="bystander"]')
        wait(lambda: kept and kept[-1] == 0x98, "the banned client's DISCONNECT")
        other.loop_stop()
        raw = RawClient(b.port, level=P.MQTT_5)
        assert raw.connect("bystander").reason_code == 0x8A
        wait(lambda: "bystander" in d.find_element("id", "bans-table").text, "the ban in the list")
        _click(d, 'button[data-unban-kind="clientid"][data-unban-value="bystander"]')
        wait(lambda: get_json(b.dashboard + "/api/v1/bans", user=ADMIN,
                              password=ADMIN_PW)[1]["bans"] == [], "the ban removed")
        assert RawClient(b.port, level=P.MQTT_5).connect("bystander").reason_code == 0

        # delete a retained message from the topic tree
        d.get(b.dashboard + "/#topics")
        wait(lambda: "open" in d.find_element("id", "topic-tree").text, "the retained value")
        _click(d, 'button[data-delete-retained="plant/valve"]')
        wait(lambda: get_json(b.dashboard + "/api/v1/retained?filter=plant/%23", user=ADMIN,
                              password=ADMIN_PW)[1]["retained"] == [], "the retained message gone")
        logs = b.logs()
        for action in ("action=kick", "action=ban", "action=unban", "action=delete-retained"):
            assert f"audit: user='{ADMIN}' from='127.0.0.1' {action}" in logs, action
    finally:
        for c in (victim, other):
            c.loop_stop()


def test_rules_panel_shows_the_jobs_status_and_pauses_resumes_and_removes(make_broker, tmp_path,
                                                                        browser):
    """The continuous rules on the clients page: each rule with its source, target, the job's
    state, rate, rows and last error; Pause / Resume / Remove go through /api/v1/rules."""
    from settings import rules as spec
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[[history.rules]]\nname = "hot"\nsql = "SELECT topic FROM messages"\n'
                   'publish = "alerts/hot"\n')
    spec.write_store(str(tmp_path), spec.Store([spec.check(
        {"name": "cold", "sql": "SELECT topic FROM messages", "table": "cold_rows"})]))
    spec.write_status(str(tmp_path), {
        "hot": {"state": "running", "rows": 42, "rows_per_second": 1.5, "last_error": ""},
        "cold": {"state": "failed", "rows": 0, "last_error": "STREAMING_AGGREGATION needs a window"}})
    b = start_dashboard(make_broker, tmp_path, args=["--config", str(cfg)])
    d = browser
    log_in(d, b.dashboard + "/#clients", ADMIN, ADMIN_PW)
    wait(lambda: d.find_element("id", "rules-table").get_attribute("data-rows") == "2",
         "the rules listed")
    text = d.find_element("id", "rules-table").text
    assert "alerts/hot" in text and "running" in text and "1.50" in text and "42" in text
    assert "table cold_rows" in text and "STREAMING_AGGREGATION needs a window" in text
    # a config rule has no Remove button: it is removed from the file
    assert not d.find_elements("css selector", 'button[data-rule-remove="hot"]')
    _click(d, 'button[data-rule-pause="hot"]')
    wait(lambda: d.find_elements("css selector", 'button[data-rule-resume="hot"]'),
         "the Resume button of the paused rule")
    assert spec.read_store(str(tmp_path)).paused == {"hot"}
    _click(d, 'button[data-rule-resume="hot"]')
    wait(lambda: spec.read_store(str(tmp_path)).paused == set(), "the rule resumed")
    _click(d, 'button[data-rule-remove="cold"]')
    wait(lambda: d.find_element("id", "rules-table").get_attribute("data-rows") == "1",
         "the rule removed from the list")
    assert spec.read_store(str(tmp_path)).rules == []
    logs = b.logs()
    for action in ("action=rule-pause", "action=rule-resume", "action=rule-remove"):
        assert f"audit: user='{ADMIN}' from='127.0.0.1' {action}" in logs, action


def test_a_viewer_sees_no_admin_buttons(make_broker, tmp_path, browser):
    b = start_dashboard(make_broker, tmp_path)
    c = _client(b.port, "someone", [])
    try:
        log_in(browser, b.dashboard + "/#clients", VIEWER, VIEWER_PW)
        wait(lambda: int(browser.find_element("id", "clients-table").get_attribute("data-rows"))
             == 1, "the client listed")
        assert not browser.find_element("css selector", 'button[data-kick="someone"]').is_displayed()
        assert not browser.find_element("css selector", 'button[data-ban="someone"]').is_displayed()
    finally:
        c.loop_stop()
        c.disconnect()


def test_the_login_form_says_what_was_wrong(make_broker, tmp_path, browser):
    b = start_dashboard(make_broker, tmp_path)
    d = browser
    d.get(b.dashboard + "/")
    wait(lambda: d.find_element("id", "login").is_displayed(), "the login form")
    assert not d.find_element("id", "main").is_displayed()
    assert d.find_element("id", "login-message").get_attribute("class") == "note"  # no error yet
    d.find_element("id", "login-user").send_keys(ADMIN)
    d.find_element("id", "login-password").send_keys("nope")
    d.find_element("id", "login-submit").click()
    wait(lambda: "wrong user name or password" in d.find_element("id", "login-message").text,
         "the error on the form")
    time.sleep(0.2)
    assert not d.find_element("id", "main").is_displayed()
