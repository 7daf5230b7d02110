"""Sparkplug B topics and payloads -> rows of ``sparkplug_metrics`` (one per metric).

Topic namespace (Sparkplug 3.0, section 4.1): ``spBv1.0/<group>/<type>/<edge node>[/<device>]``,
types NBIRTH, NDATA, NDEATH, NCMD (no device) and DBIRTH, DDATA, DDEATH, DCMD (a device). Other
topics, STATE among them, are not Sparkplug B payloads here (``parse_topic`` -> None).

The wire format is read by the ``protobuf`` package with Eclipse Tahu's ``sparkplug_b.proto``
(``sparkplug_b_pb2``). A metric's value is given by its datatype (the metric's own, or its
birth's when a DATA metric has only an alias), as JSON text for the table's VARIANT column:

- Int8/16/32/64: sign restored from the two's complement the unsigned fields carry; UInt*,
  DateTime (ms since the epoch): numbers; Float, Double: numbers (written with an exponent so
  that Spark's ``parse_json`` keeps them doubles, not decimals; Float at float32 precision);
- Boolean, String, Text, UUID: as they are; Bytes, File: base64 text;
- DataSet: ``{"columns": [...], "types": [...], "rows": [[...], ...]}``; Template:
  ``{"template_ref", "version", "is_definition", "metrics": [...], "parameters": [...]}``;
- the array types (bytes_value, little-endian, Sparkplug 3.0 section 6.4.17): JSON arrays;
- is_null, or no value: NULL.

A payload that cannot be decoded raises ``Malformed`` (the caller counts it and goes on).
"""
from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from json.encoder import encode_basestring as _json_str  # the C function
from typing import Any, Mapping

from google.protobuf.message import DecodeError

from sink.history.sparkplug import sparkplug_b_pb2 as pb

NAMESPACE = "spBv1.0"
NODE_TYPES = ("NBIRTH", "NDATA", "NDEATH", "NCMD")
DEVICE_TYPES = ("DBIRTH", "DDATA", "DDEATH", "DCMD")
BIRTHS = ("NBIRTH", "DBIRTH")

#: datatype code -> its Sparkplug name (Int32, Double, ...)
TYPE_NAMES: dict[int, str] = {v.number: v.name for v in pb.DESCRIPTOR.enum_types_by_name["DataType"].values}
_SIGNED_BITS = {1: 8, 2: 16, 3: 32, 4: 64}      # Int8, Int16, Int32, Int64
_UNSIGNED = {5, 6, 7, 8, 13}                    # UInt8/16/32/64, DateTime
_FLOAT, _DOUBLE, _BOOLEAN = 9, 10, 11
_TEXTS = {12, 14, 15}                           # String, Text, UUID
_BYTES = {17, 18}                               # Bytes, File
_DATASET, _TEMPLATE, _PROPERTYSET, _PROPERTYSETLIST = 16, 19, 20, 21
_ARRAYS = {22: "b", 23: "h", 24: "i", 25: "q", 26: "B", 27: "H", 28: "I", 29: "Q", 30: "f",
           31: "d", 34: "q"}                     # + BooleanArray 32, StringArray 33
_BOOLEAN_ARRAY, _STRING_ARRAY = 32, 33


class Malformed(ValueError):
    """A payload on a Sparkplug B topic that is not a Sparkplug B payload."""


@dataclass(frozen=True)
class Topic:
    group_id: str
    message_type: str
    edge_node_id: str
    device_id: str | None   # None: a node's message

    @property
    def key(self) -> tuple[str, str, str | None]:
        """Whose births name the aliases of this message's metrics."""
        return (self.group_id, self.edge_node_id, self.device_id)


def parse_topic(topic: str | None) -> Topic | None:
    """The topic's parts when it is a Sparkplug B node or device message, else None."""
    if not topic or not topic.startswith(NAMESPACE + "/"):
        return None
    parts = topic.split("/")
    if len(parts) == 4 and parts[2] in NODE_TYPES:
        device = None
    elif len(parts) == 5 and parts[2] in DEVICE_TYPES:
        device = parts[4]
    else:
        return None
    if not parts[1] or not parts[3] or device == "":
        return None
    return Topic(parts[1], parts[2], parts[3], device)


@dataclass
class Metric:
    """One decoded metric: its name as the payload gives it (None: an alias only), alias,
    datatype code (None: not in the payload), value (JSON-ready Python), timestamp (ms)."""
    name: str | None
    alias: int | None
    datatype: int | None
    value: Any
    timestamp: int | None


@dataclass
class Payload:
    timestamp: int | None
    seq: int | None
    metrics: list[Metric]


def parse(raw: bytes | None, known: Mapping[int, tuple[str | None, int | None]] | None = None) -> Payload:
    """The payload's metrics; ``known``: alias -> (name, datatype) of the birth, for DATA
    metrics that carry no datatype. Malformed when the bytes are not a Sparkplug B payload."""
    msg = pb.Payload()
    try:
        msg.ParseFromString(raw or b"")
    except (DecodeError, RuntimeWarning) as exc:
        raise Malformed(f"not a Sparkplug B payload: {exc}") from None
    if not msg.ListFields():   # empty, or only fields the definition does not have
        raise Malformed("not a Sparkplug B payload: none of its fields (every payload has a "
                        "timestamp)")
    metrics = []
    for i, m in enumerate(msg.metrics):
        alias = m.alias if m.HasField("alias") else None
        datatype = m.datatype if m.HasField("datatype") else None
        if datatype is None and alias is not None and known:
            datatype = (known.get(alias) or (None, None))[1]
        try:
            value = None if m.is_null else _metric_value(m, datatype)
        except (ValueError, struct.error, UnicodeDecodeError, IndexError) as exc:
            raise Malformed(f"metric {i} ({m.name or alias}): {exc}") from None
        metrics.append(Metric(m.name if m.HasField("name") else None, alias, datatype, value,
                              m.timestamp if m.HasField("timestamp") else None))
    return Payload(msg.timestamp if msg.HasField("timestamp") else None,
                   msg.seq if msg.HasField("seq") else None, metrics)


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _float32(v: float) -> float:
    """The shortest decimal that reads back as the same float32 (0.1, not 0.100000001490116)."""
    if not math.isfinite(v):
        return v
    for digits in range(6, 10):
        short = float(f"{v:.{digits}g}")
        if struct.unpack("<f", struct.pack("<f", short))[0] == v:
            return short
    return v


def _scalar(obj: Any, field: str | None, datatype: int | None) -> Any:
    """A value of a oneof ``value`` (Metric, DataSetValue, Parameter, PropertyValue) by type."""
    if field is None:
        return None
    raw = getattr(obj, field)
    if datatype in _SIGNED_BITS and isinstance(raw, int) and not isinstance(raw, bool):
        return _signed(raw, _SIGNED_BITS[datatype])
    if field == "float_value" or datatype == _FLOAT and isinstance(raw, float):
        return _float32(raw)
    if field == "bytes_value":
        return _bytes_value(raw, datatype)
    if field == "dataset_value":
        return _dataset(raw)
    if field == "template_value":
        return _template(raw)
    if field == "propertyset_value":
        return _propertyset(raw)
    if field == "propertysets_value":
        return [_propertyset(s) for s in raw.propertyset]
    if field == "extension_value":
        return None
    return raw


def _metric_value(m: Any, datatype: int | None) -> Any:
    return _scalar(m, m.WhichOneof("value"), datatype)


def _bytes_value(raw: bytes, datatype: int | None) -> Any:
    if datatype in _ARRAYS:
        fmt = _ARRAYS[datatype]
        size = struct.calcsize(fmt)
        if len(raw) % size:
            raise ValueError(f"{TYPE_NAMES[datatype]} of {len(raw)} bytes")
        values = [v for (v,) in struct.iter_unpack("<" + fmt, raw)]
        return [_float32(v) for v in values] if fmt == "f" else values
    if datatype == _BOOLEAN_ARRAY:   # a uint32 count, then the bits, most significant first
        (count,) = struct.unpack_from("<I", raw)
        if len(raw) - 4 < (count + 7) // 8:
            raise ValueError(f"BooleanArray of {count} values in {len(raw) - 4} bytes")
        return [bool(raw[4 + i // 8] >> (7 - i % 8) & 1) for i in range(count)]
    if datatype == _STRING_ARRAY:    # UTF-8 strings, each ended by a zero byte
        if not raw:
            return []
        if not raw.endswith(b"\0"):
            raise ValueError("StringArray not ended by a zero byte")
        return [s.decode("utf-8") for s in raw[:-1].split(b"\0")]
    return base64.b64encode(raw).decode("ascii")


def _dataset(ds: Any) -> dict:
    types = list(ds.types)
    rows = []
    for row in ds.rows:
        rows.append([_scalar(e, e.WhichOneof("value"), types[i] if i < len(types) else None)
                     for i, e in enumerate(row.elements)])
    return {"columns": list(ds.columns), "types": [TYPE_NAMES.get(t, str(t)) for t in types],
            "rows": rows}


def _template(t: Any) -> dict:
    out: dict[str, Any] = {}
    if t.HasField("template_ref"):
        out["template_ref"] = t.template_ref
    if t.HasField("version"):
        out["version"] = t.version
    if t.HasField("is_definition"):
        out["is_definition"] = t.is_definition
    out["metrics"] = [{"name": m.name if m.HasField("name") else None,
                       "datatype": TYPE_NAMES.get(m.datatype) if m.HasField("datatype") else None,
                       "value": None if m.is_null else _metric_value(m, m.datatype if m.HasField("datatype") else None)}
                      for m in t.metrics]
    out["parameters"] = [{"name": p.name, "type": TYPE_NAMES.get(p.type),
                          "value": _scalar(p, p.WhichOneof("value"), p.type)} for p in t.parameters]
    return out


def _propertyset(s: Any) -> dict:
    return {k: (None if v.is_null else _scalar(v, v.WhichOneof("value"), v.type))
            for k, v in zip(s.keys, s.values)}


def to_json(value: Any) -> str | None:
    """JSON text of a decoded value for ``parse_json`` (None stays NULL): floats with an exponent
    (``parse_json`` reads 1.5 as a decimal, 1.5E0 as a double); non-finite floats as NULL."""
    if value is None:
        return None
    return _json(value)


def _json(v: Any) -> str:
    t = type(v)
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if t is str:
        return _json_str(v)
    if v is None:
        return "null"
    if t is float:
        if not math.isfinite(v):
            return "null"
        text = repr(v)
        return text if "e" in text else text + "e0"
    if isinstance(v, dict):
        return "{" + ",".join(f"{_json_str(str(k))}:{_json(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join([_json(x) for x in v]) + "]"
    return _json_str(str(v))
