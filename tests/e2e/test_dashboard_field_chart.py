"""The History tab's JSON field chart in headless Chromium against a broker process: JSON
payloads {"temp": N} published on sensors/..., the form asks for sensors/# and temp, and the
chart draws the live series (the broker's samples) through the published values; without the
history job the chart's note says the job is not running (the live series stays)."""
from __future__ import annotations

import paho.mqtt.client as mqtt
import pytest

from tests.e2e.chromium import log_in, start_chromium, wait
from tests.integration.dashboard_http import VIEWER, VIEWER_PW, start_dashboard

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# the field chart's live series as drawn: [values with a point, min, max, stroke through newest]
LIVE_DRAWN = """
const u = field.chart && field.chart.plot;
if (!u) return null;
const s = u.series[1], ys = (u.data[1] || []).filter((y) => y != null);
let last = -1;
for (let j = 0; j < u.data[1].length; j++) if (u.data[1][j] != null) last = j;
let on = false;
if (s._paths && s._paths.stroke && last >= 0) {
  u.ctx.save(); u.ctx.lineWidth = 4;
  on = u.ctx.isPointInStroke(s._paths.stroke, u.valToPos(u.data[0][last], "x", true),
                             u.valToPos(u.data[1][last], s.scale, true));
  u.ctx.restore();
}
return {label: s.label, points: ys.length, min: Math.min(...ys), max: Math.max(...ys), on_stroke: on};
"""


@pytest.fixture
def browser(tmp_path_factory):
    d = start_chromium(tmp_path_factory.mktemp("chromium"))
    yield d
    d.quit()


def test_field_chart_draws_the_live_series_of_a_json_field(make_broker, tmp_path, browser):
    b = start_dashboard(make_broker, tmp_path, {"dashboard.sample_seconds": 0.5})
    d = browser
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="thermo", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    try:
        log_in(d, b.dashboard + "/", VIEWER, VIEWER_PW)
        d.get(b.dashboard + "/#history")
        wait(lambda: d.find_element("id", "f-filter").is_displayed(), "the field form")
        d.find_element("id", "f-field").clear()
        d.find_element("id", "f-field").send_keys("temp")
        d.find_element("id", "field-form").submit()
        wait(lambda: d.find_element("id", "field").get_attribute("data-state") == "done",
             "the field chart's first answer")

        def drawn():
            for n in (20, 21, 22):
                c.publish("sensors/a", b'{"temp": %d}' % n, qos=1).wait_for_publish(5)
                c.publish("sensors/b", b"not json", qos=1).wait_for_publish(5)
            s = d.execute_script(LIVE_DRAWN)
            return s if s and s["points"] >= 2 and s["on_stroke"] else None
        s = wait(drawn, "the live series of temp")
        assert s["label"] == "live (avg)"
        assert 20 <= s["min"] <= s["max"] <= 22, s
        wait(lambda: "not running" in d.find_element("id", "field-note").text,
             "the history part saying the job is not running")
        note = d.find_element("id", "field-note").text
        assert "not JSON" in note and " 0 not JSON" not in note, note
        d.save_screenshot(str(tmp_path / "field.png"))
    finally:
        c.loop_stop()
        c.disconnect()
