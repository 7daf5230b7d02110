"""The job's py4j converter for NumPy values (sink/history/spark.py): PySpark's converter is asked
only about NumPy objects, once NumPy is loaded, and asking never fails while another thread is
still importing NumPy (a module is in sys.modules from its import's first line)."""
from __future__ import annotations

import sys
import types

import numpy as np

from sink.history.spark import _NumpyOnlyWhenLoaded


class Inner:
    """PySpark's converter: says yes, and remembers what it was asked about."""

    def __init__(self) -> None:
        self.asked: list[object] = []

    def can_convert(self, obj: object) -> bool:
        self.asked.append(obj)
        return True


def test_while_numpy_is_being_imported_nothing_is_a_numpy_value(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy", types.ModuleType("numpy"))   # np.generic not yet made
    inner = Inner()
    assert _NumpyOnlyWhenLoaded(inner).can_convert(1.5) is False
    assert inner.asked == []


def test_without_numpy_loaded_pyspark_is_not_asked(monkeypatch):
    monkeypatch.delitem(sys.modules, "numpy")
    inner = Inner()
    assert _NumpyOnlyWhenLoaded(inner).can_convert("x") is False
    assert inner.asked == []


def test_numpy_values_are_asked_about_once_numpy_is_loaded():
    inner = Inner()
    conv = _NumpyOnlyWhenLoaded(inner)
    value = np.float64(1.5)
    assert conv.can_convert(value) is True and conv.can_convert(1.5) is False
    assert inner.asked == [value]
