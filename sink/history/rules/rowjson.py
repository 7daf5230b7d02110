"""A rule's result row as the JSON object published to MQTT: column name -> value.

* VARIANT (``payload_json`` and expressions of it): the JSON value it holds, as JSON;
* TIMESTAMP: ISO-8601 in UTC with milliseconds and ``Z`` (``2024-05-02T10:00:00.250Z``); the
  job's session is in UTC, so Spark's naive datetimes are UTC; DATE: ``2024-05-02``;
* BINARY: base64 text; DECIMAL: a JSON number; a struct (a window): an object; arrays: arrays;
  NaN and infinities: null (JSON has none).
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from typing import Any


def iso_utc(t: dt.datetime) -> str:
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def plain(value: Any) -> Any:
    """A Spark value (from Row.asDict(recursive=True)) as a JSON-ready Python value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dt.datetime):
        return iso_utc(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if hasattr(value, "asDict"):   # a nested Row
            return {str(k): plain(v) for k, v in value.asDict(recursive=True).items()}
        return [plain(v) for v in value]
    to_json = getattr(value, "toJson", None)   # pyspark's VariantVal
    if callable(to_json):
        return json.loads(to_json("UTC"))
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def row_json(row: Any) -> bytes:
    """A Row (or a dict) as the UTF-8 JSON object published: keys in the row's column order."""
    d = row.asDict(recursive=True) if hasattr(row, "asDict") else dict(row)
    return json.dumps({str(k): plain(v) for k, v in d.items()}, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False).encode()
