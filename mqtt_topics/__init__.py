"""Topic names, topic filters and the subscription trie (MQTT section 4.7).

A leaf module: pure functions and one data structure, no imports from broker or sink, so
both the broker (routing, retain, ACLs) and the sink (per-topic rules) use the same matcher.
"""
from __future__ import annotations

from collections.abc import Hashable
from types import MappingProxyType
from typing import Any

SHARE_PREFIX = "$share/"


def valid_topic_name(topic: str) -> bool:
    """A non-empty topic name without wildcards [MQTT-4.7.3-1], [MQTT-4.7.0-1], [MQTT-3.3.2-2]."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_topic_filter(filt: str) -> bool:
    """[MQTT-4.7.1-1]: '#' last and alone in its level; [MQTT-4.7.1-2]: '+' alone in its level."""
    if not filt:  # [MQTT-4.7.3-1]
        return False
    if "+" not in filt and "#" not in filt:
        return True
    levels = filt.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != last):
            return False
        if "+" in level and level != "+":
            return False
    return True


def parse_shared(filt: str) -> tuple[str, str] | None:
    """'$share/{group}/{filter}' -> (group, filter); None when not shared.

    Raises ValueError for a malformed shared subscription [MQTT-4.8.2-1], [MQTT-4.8.2-2].
    """
    if not filt.startswith(SHARE_PREFIX):
        return None
    rest = filt[len(SHARE_PREFIX):]
    group, sep, inner = rest.partition("/")
    if not group or not sep or not inner or "+" in group or "#" in group:
        raise ValueError("shared subscription must be $share/{ShareName}/{filter}")
    return group, inner


def matches(filt: str, topic: str) -> bool:
    """Whether a topic filter matches a topic name (used for rules and retained messages)."""
    if topic.startswith("$") and filt[:1] in ("+", "#"):  # [MQTT-4.7.2-1]
        return False
    f = filt.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


def wildcard_shape(filt: str) -> tuple[str, int]:
    """(shape, wildcard levels) of a topic filter with a '+' level: the shape is the filter with
    every literal level alike ('a/+/b' -> '/+/'), the wildcard levels count its levels from the
    first '+' on, a last '#' aside ('a/+/b/#' -> 2). TopicTrie.match() visits at most one node
    per shape prefix (the topic fixes every literal level), so the trie nodes a topic can visit
    below a '+' are at most the sum of the wildcard levels of the distinct shapes subscribed;
    the literal levels above them at most one per topic level. ('', 0) without a '+'."""
    if "+" not in filt:
        return "", 0
    levels = filt.split("/")
    n = len(levels) - levels.index("+") - (levels[-1] == "#")
    return "/".join([x if x == "+" or x == "#" else "" for x in levels]), n


# A node's children or values while it has none: one shared, read-only empty mapping (an empty
# dict is 64 bytes; a subscriber's own filter, as devices have, ends in a node without children
# below a node without values: 128 bytes less per such filter)
NOTHING: MappingProxyType[Any, Any] = MappingProxyType({})


class _Node:
    __slots__ = ("children", "values")

    def __init__(self) -> None:
        # NOTHING (read-only) stands in for an empty dict: replaced by a dict before any write
        self.children: dict[str, _Node] = NOTHING  # type: ignore[assignment]
        self.values: dict[Hashable, Any] = NOTHING  # type: ignore[assignment]


class TopicTrie:
    """Maps topic filters to {key: value} and finds every filter matching a topic."""

    def __init__(self) -> None:
        self.root = _Node()

    def add(self, filt: str, key: Hashable, value: Any) -> bool:
        """Store value under key for filt; return True when the key was new."""
        node = self.root
        for level in filt.split("/"):
            children = node.children
            child = children.get(level)
            if child is None:
                if children is NOTHING:
                    children = node.children = {}
                child = children[level] = _Node()
            node = child
        values = node.values
        if values is NOTHING:
            values = node.values = {}
        new = key not in values
        values[key] = value
        return new

    def remove(self, filt: str, key: Hashable) -> bool:
        path = [self.root]
        levels = filt.split("/")
        for level in levels:
            node = path[-1].children.get(level)
            if node is None:
                return False
            path.append(node)
        leaf = path[-1]
        if leaf.values.get(key) is None:
            return False
        del leaf.values[key]
        if not leaf.values:
            leaf.values = NOTHING  # type: ignore[assignment]
        for i in range(len(levels), 0, -1):  # prune empty branches
            node = path[i]
            if node.values or node.children:
                break
            parent = path[i - 1]
            del parent.children[levels[i - 1]]
            if not parent.children:
                parent.children = NOTHING  # type: ignore[assignment]
        return True

    def match(self, topic: str) -> list[dict]:
        """The value dicts of every node whose filter matches topic."""
        out: list[dict] = []
        _walk(self.root, topic.split("/"), 0, topic.startswith("$"), out)
        return out


# The trie walk is two module functions, not closures in match(): a recursive closure is a
# reference cycle (function -> cell -> function) that keeps the topic's levels, and the values
# found, in memory until the garbage collector runs.
def _walk(node: _Node, levels: list[str], i: int, dollar: bool, out: list[dict]) -> None:
    """Collect the matches below `node`, whose children are candidates for levels[i]."""
    children = node.children
    if not children:
        return
    wild = not (dollar and i == 0)  # [MQTT-4.7.2-1]
    if wild:
        h = children.get("#")
        if h is not None and h.values:
            out.append(h.values)
    c = children.get(levels[i])
    if c is not None:
        _step(c, levels, i, dollar, out)
    if wild:
        c = children.get("+")
        if c is not None:
            _step(c, levels, i, dollar, out)


def _step(c: _Node, levels: list[str], i: int, dollar: bool, out: list[dict]) -> None:
    """Continue below child c, which matched level i."""
    if i + 1 == len(levels):
        if c.values:
            out.append(c.values)
        h = c.children.get("#")  # 'a/#' also matches 'a' (4.7.1.2)
        if h is not None and h.values:
            out.append(h.values)
    else:
        _walk(c, levels, i + 1, dollar, out)
