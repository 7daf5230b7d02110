"""scratch"""
from __future__ import annotations
from typing import Any


class _NoEntries(dict[Any, Any]):
    """The dict a session shares while it has none of its own (subscriptions, inflight_out): it
    reads as empty; a write raises TypeError (the writer gives the session its own dict)."""
    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a session's shared empty dict is read-only")

    __setitem__ = setdefault = update = __ior__ = _read_only


class _NoIds(set[int]):
    """The set of QoS 2 packet ids a session shares while it has none of its own (inflight_in):
    it reads as empty (`pid in NO_IDS` is False); a write raises TypeError (the writer first gives
    the session its own set: Session.qos2_received)."""
    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a session's shared empty set is read-only")

    add = remove = discard = pop = clear = update = __ior__ = _read_only
    difference_update = intersection_update = symmetric_difference_update = _read_only
    __iand__ = __isub__ = __ixor__ = _read_only


