"""The shared, read-only empty containers a session or connection holds until its first entry.

Memory per idle connection: an idle session makes no containers of its own (an empty dict is 64
bytes, an empty set 216, an empty deque 624). It holds one of these shared empties instead, of
the very type it declares, and its writer gives it its own container at the first entry (it
tests `is NO_ENTRIES` / `is NO_IDS` / `is NOTHING` first). A write that forgot to raises
TypeError rather than fill the shared empty:

- dict (`NO_ENTRIES`): reads as empty; writes raise, compiled or not (mypyc's dict operations
  call a subclass's own methods).
- deque (`NOTHING`): the same (mypyc has no deque primitives: every call is the method's own).
- set (`NO_IDS`): reads as empty; writes raise when run as Python. Compiled code adds to a set
  with `PySet_Add`, which does not look at a subclass, so the one writer
  (`Session.qos2_received`) gives the session its own set first.

This module is never compiled (broker/native.py): mypyc does not compile a subclass of a
built-in container that overrides its methods by assignment.
"""
from __future__ import annotations

from collections import deque
from typing import Any


def _read_only(*args: Any, **kwargs: Any) -> Any:
    raise TypeError("a session's shared empty container is read-only: give it its own first")


class _NoEntries(dict[Any, Any]):
    __slots__ = ()
    __setitem__ = setdefault = update = __ior__ = _read_only


class _NoIds(set[int]):
    __slots__ = ()
    add = remove = discard = pop = clear = update = __ior__ = _read_only
    difference_update = intersection_update = symmetric_difference_update = _read_only
    __iand__ = __isub__ = __ixor__ = _read_only


class _NoDeque(deque[Any]):
    __slots__ = ()
    append = appendleft = extend = extendleft = insert = __iadd__ = __setitem__ = _read_only


NO_ENTRIES: dict[Any, Any] = _NoEntries()  # Session.subscriptions, inflight_out; Connection aliases
NO_IDS: set[int] = _NoIds()                # Session.inflight_in
NOTHING: deque[Any] = _NoDeque()           # Session.queue, feeds, resend_pending
