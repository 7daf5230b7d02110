"""Retained messages (3.3.1.3): one per topic, found by topic filter."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mqtt_topics import NOTHING, matches

if TYPE_CHECKING:
    from .message import Message

# mqtt_topics' shared read-only empty mapping (the same object), typed to stand in for a dict
NO_CHILDREN: Any = NOTHING


class _Node:
    __slots__ = ("children", "message", "seq")

    def __init__(self) -> None:
        # NO_CHILDREN (shared, read-only) until the first child: most nodes hold a message and no
        # children, 64 bytes less per retained message
        self.children: dict[str, _Node] = NO_CHILDREN
        self.message: Message | None = None
        self.seq = 0  # when `message` was stored (RetainedStore.seq then): walk() compares it


class RetainedStore:
    """topic -> message, in a level tree so wildcard filters walk only what can match.
    `count` and `bytes` (the sum of `size(message)`, when a size function is given) are what the
    broker's bounds (mqtt.max_retained_messages, max_retained_bytes) compare against."""

    def __init__(self, size: Callable[[Message], int] | None = None) -> None:
        self.root = _Node()
        self.count = 0
        self.bytes = 0
        self.size = size
        self.seq = 0  # sequence number of the next message stored (walk(): what came before)

    def set(self, topic: str, message: Message | None) -> None:
        """Store or replace [MQTT-3.3.1-5]; a None message deletes [MQTT-3.3.1-6], [MQTT-3.3.1-7]."""
        if message is None:
            self.delete(topic)
            return
        node = self.root
        for level in topic.split("/"):
            children = node.children
            child = children.get(level)
            if child is None:
                if children is NO_CHILDREN:
                    children = node.children = {}
                child = children[level] = _Node()
            node = child
        old = node.message
        if old is None:
            self.count += 1
        size = self.size
        if size is not None:
            self.bytes += size(message) - (0 if old is None else size(old))
        node.message = message
        node.seq = self.seq
        self.seq += 1

    def delete(self, topic: str) -> None:
        path: list[_Node] = [self.root]
        levels = topic.split("/")
        for level in levels:
            step = path[-1].children.get(level)
            if step is None:
                return
            path.append(step)
        old = path[-1].message
        if old is None:
            return
        path[-1].message = None
        self.count -= 1
        if self.size is not None:
            self.bytes -= self.size(old)
        for i in range(len(levels), 0, -1):
            if path[i].message is not None or path[i].children:
                break
            parent = path[i - 1]
            del parent.children[levels[i - 1]]
            if not parent.children:
                parent.children = NO_CHILDREN

    def get(self, topic: str) -> Message | None:
        node = self.root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.message

    def match(self, filt: str) -> list[Message]:
        """Retained messages whose topic matches filt ('$' topics excluded from leading wildcards)."""
        out: list[Message] = []
        _walk(self.root, filt.split("/"), 0, out)
        return out

    def walk(self, filt: str) -> Iterator[tuple[_Node, Message]]:
        """Lazily, (node, message) for each retained message matching `filt` that was stored
        before this call, in depth-first topic order: a subscription's retained delivery takes a few at a
        time (Session.pump), so matching a filter against a large store never holds the event
        loop. Changes while it is suspended are safe: a message replaced or deleted since is not
        yielded (the newer one was routed live), topics added since are not visited; the caller
        checks `node.message is message` again before it sends one it held."""
        return _walk_lazily(self.root, filt.split("/"), self.seq)

    def all(self) -> list[Message]:
        out = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.message is not None:
                out.append(nd.message)
            stack.extend(nd.children.values())
        return out


__all__ = ["RetainedStore", "matches"]


# The walk is module functions, not closures in match(): a recursive closure is a reference
# cycle (function -> cell -> function) that keeps the messages found in memory until the
# garbage collector runs.
def _walk(node: _Node, levels: list[str], i: int, out: list[Message]) -> None:
    """Collect the retained messages at or below `node` that match levels[i:]."""
    if i == len(levels):
        if node.message is not None:
            out.append(node.message)
        return
    level = levels[i]
    child: _Node | None
    if level == "#":
        # '#' matches the parent level too (4.7.1.2)
        if i > 0 and node.message is not None:
            out.append(node.message)
        for name, child in node.children.items():
            if i == 0 and name.startswith("$"):  # [MQTT-4.7.2-1]
                continue
            _collect(child, out)
        return
    if level == "+":
        for name, child in node.children.items():
            if i == 0 and name.startswith("$"):  # [MQTT-4.7.2-1]
                continue
            _walk(child, levels, i + 1, out)
        return
    child = node.children.get(level)
    if child is not None:
        _walk(child, levels, i + 1, out)


def _walk_lazily(root: _Node, levels: list[str], before: int) -> Iterator[tuple[_Node, Message]]:
    """RetainedStore.walk(): a generator over an explicit stack (no recursion, no closure)."""
    n = len(levels)
    stack = [(root, 0)]
    while stack:
        node, i = stack.pop()
        if i == n:
            m = node.message
            if m is not None and node.seq < before:
                yield node, m
            continue
        level = levels[i]
        if level == "#" or level == "+":
            kids = [c for name, c in node.children.items()
                    if not (i == 0 and name.startswith("$"))]  # [MQTT-4.7.2-1]
            kids.reverse()
            if level == "+":
                stack.extend((c, i + 1) for c in kids)
                continue
            m = node.message
            if i > 0 and m is not None and node.seq < before:  # '#' matches the parent level too
                yield node, m
            while kids:  # every message below, depth first
                nd = kids.pop()
                m = nd.message
                if m is not None and nd.seq < before:
                    yield nd, m
                if nd.children:
                    more = list(nd.children.values())
                    more.reverse()
                    kids.extend(more)
            continue
        child = node.children.get(level)
        if child is not None:
            stack.append((child, i + 1))


def _collect(node: _Node, out: list[Message]) -> None:
    """Every retained message at or below `node`."""
    stack = [node]
    while stack:
        nd = stack.pop()
        if nd.message is not None:
            out.append(nd.message)
        stack.extend(nd.children.values())
