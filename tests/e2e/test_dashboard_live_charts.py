"""The Live tab's charts in headless Chromium against a broker process with its Kafka sink on
(Kafka unreachable, keep_until = "history": both lag figures are known): every series a chart
names is drawn, and the time labels under a chart never overlap, whatever the time span."""
from __future__ import annotations

import paho.mqtt.client as mqtt
import pytest

from tests.conftest import free_port
from tests.e2e.chromium import log_in, start_chromium, wait
from tests.integration.dashboard_http import VIEWER, VIEWER_PW, start_dashboard

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# For one chart (a Chart of the page: live.charts.<name>): per named series, how many points
# have a value and whether the drawn stroke passes through the newest of them (canvas pixels,
# the way uPlot drew it).
SERIES_DRAWN = """
const u = live.charts[arguments[0]].plot;
if (!u) return null;
const out = [];
for (let i = 1; i < u.series.length; i++) {
  const s = u.series[i], ys = u.data[i] || [];
  let last = -1, n = 0;
  for (let j = 0; j < ys.length; j++) if (ys[j] != null) { n++; last = j; }
  let onStroke = false;
  const stroke = s._paths && s._paths.stroke;
  if (stroke && last >= 0) {
    const x = u.valToPos(u.data[0][last], "x", true), y = u.valToPos(ys[last], s.scale, true);
    u.ctx.save(); u.ctx.lineWidth = 4;
    onStroke = u.ctx.isPointInStroke(stroke, x, y);
    u.ctx.restore();
  }
  out.push({label: s.label, points: n, on_stroke: onStroke});
}
return out;
"""

# The x axis' tick labels of one chart as drawn: [left, right] in canvas pixels (uPlot draws
# them centred on their tick, in the axis font), in order.
TICK_BOXES = """
const u = live.charts[arguments[0]].plot, ax = u.axes[0];
const ctx = u.ctx;
ctx.save(); ctx.font = ax.font[0];
const boxes = [];
(ax._splits || []).forEach((v, i) => {
  const text = ax._values && ax._values[i];
  if (text == null || text === "") return;
  const x = u.valToPos(v, "x", true);
  if (x < u.bbox.left - 1 || x > u.bbox.left + u.bbox.width + 1) return;
  const w = ctx.measureText(String(text)).width;
  boxes.push([x - w / 2, x + w / 2, String(text)]);
});
ctx.restore();
return boxes;
"""

# Draw the chart with a made-up span of `seconds` (one point a second, the newest now).
SET_SPAN = """
const c = live.charts[arguments[0]], n = arguments[1], now = Date.now() / 1000;
const t = [], ys = c.labels.map(() => []);
for (let i = n; i >= 0; i--) { t.push(now - i); ys.forEach((y, k) => y.push(k + 1)); }
c.set([t].concat(ys));
return c.plot.width;
"""


@pytest.fixture
def browser(tmp_path_factory):
    d = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield d
    finally:
        d.quit()


def _overlaps(boxes: list) -> list:
    return [(a[2], b[2]) for a, b in zip(boxes, boxes[1:]) if b[0] < a[1]]


def live_charts(d) -> list:
    return d.execute_script("return Object.keys(live.charts)")


def test_live_charts_draw_every_named_series_and_time_labels_do_not_overlap(make_broker, tmp_path,
                                                                            browser):
    b = start_dashboard(make_broker, tmp_path, {
        "dashboard.sample_seconds": 0.5, "sink.enabled": True, "sink.forwarder": "thread",
        "sink.bootstrap_servers": f"127.0.0.1:{free_port()}", "sink.keep_until": "history"})
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="charts", protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", b.port)
    c.loop_start()
    d = browser
    try:
        for _ in range(5):
            c.publish("charts/t", b"1", qos=1).wait_for_publish(5)
        log_in(d, b.dashboard + "/", VIEWER, VIEWER_PW)

        # the Lag chart: "Kafka forwarding lag" and "history job: since last commit"
        def lag_drawn():
            s = d.execute_script(SERIES_DRAWN, "lag")
            return s if s and all(x["points"] >= 2 and x["on_stroke"] for x in s) else None
        try:
            series = wait(lag_drawn, "both lines of the Lag chart")
        except AssertionError:
            raise AssertionError(f"Lag chart: {d.execute_script(SERIES_DRAWN, 'lag')}") from None
        assert [s["label"] for s in series] == ["Kafka forwarding lag", "history job: since last commit"]
        for name in ("in", "out", "conn", "spool"):
            drawn = d.execute_script(SERIES_DRAWN, name)
            assert drawn and all(x["points"] >= 2 and x["on_stroke"] for x in drawn), (name, drawn)
        assert "history lag" not in d.find_element("id", "live-note").text
        d.execute_script("document.getElementById('chart-lag').scrollIntoView()")
        d.save_screenshot(str(tmp_path / "lag.png"))  # for a person checking the page

        # time labels: as the page drew them from the broker's points, then over spans of a few
        # seconds to 15 minutes (the page keeps 900 points) with the refresh stopped
        for name in live_charts(d):
            assert not _overlaps(d.execute_script(TICK_BOXES, name)), name
        d.execute_script("clearInterval(ticker)")
        checked = 0
        for span in (5, 8, 10, 12, 15, 20, 25, 30, 40, 45, 50, 60, 75, 90, 120, 150, 180, 240, 300,
                     400, 600, 900):
            for name in ("in", "lag"):
                width = d.execute_script(SET_SPAN, name, span)
                boxes = d.execute_script(TICK_BOXES, name)
                assert len(boxes) >= 2, (name, span, width, boxes)
                assert not _overlaps(boxes), (name, span, width, _overlaps(boxes))
                checked += 1
        assert checked == 44
        d.save_screenshot(str(tmp_path / "live.png"))
    finally:
        c.loop_stop()
        c.disconnect()


def test_without_the_jobs_commits_the_lag_chart_says_why_it_has_no_history_line(make_broker, tmp_path,
                                                                                browser):
    """keep_until = "kafka": the sink does not follow the history job, history_lag_seconds is
    null; the Kafka line is drawn and the note under the charts says what turns the other on."""
    b = start_dashboard(make_broker, tmp_path, {
        "dashboard.sample_seconds": 0.5, "sink.enabled": True, "sink.forwarder": "thread",
        "sink.bootstrap_servers": f"127.0.0.1:{free_port()}", "sink.keep_until": "kafka"})
    d = browser
    log_in(d, b.dashboard + "/", VIEWER, VIEWER_PW)

    def kafka_drawn():
        s = d.execute_script(SERIES_DRAWN, "lag")
        return s if s and s[0]["points"] >= 2 and s[0]["on_stroke"] else None
    series = wait(kafka_drawn, "the Kafka line of the Lag chart")
    assert series[1]["points"] == 0
    note = d.find_element("id", "live-note").text
    assert "no history lag to show" in note and 'keep_until = "history"' in note, note
