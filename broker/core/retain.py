"""Retained messages (3.3.1.3): one per topic, found by topic filter."""
from __future__ import annotations

from mqtt_topics import matches


class _Node:
    __slots__ = ("children", "message")

    def __init__(self):
        self.children: dict[str, _Node] = {}
        self.message = None


class RetainedStore:
    """topic -> message, in a level tree so wildcard filters walk only what can match."""

    def __init__(self):
        self.root = _Node()
        self.count = 0

    def set(self, topic: str, message) -> None:
        """Store or replace [MQTT-3.3.1-5]; a None message deletes [MQTT-3.3.1-6], [MQTT-3.3.1-7]."""
        if message is None:
            self.delete(topic)
            return
        node = self.root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        if node.message is None:
            self.count += 1
        node.message = message

    def delete(self, topic: str) -> None:
        path = [self.root]
        levels = topic.split("/")
        for level in levels:
            node = path[-1].children.get(level)
            if node is None:
                return
            path.append(node)
        if path[-1].message is None:
            return
        path[-1].message = None
        self.count -= 1
        for i in range(len(levels), 0, -1):
            if path[i].message is not None or path[i].children:
                break
            del path[i - 1].children[levels[i - 1]]

    def get(self, topic: str):
        node = self.root
        for level in topic.split("/"):
            node = node.children.get(level)
            if node is None:
                return None
        return node.message

    def match(self, filt: str) -> list:
        """Retained messages whose topic matches filt ('$' topics excluded from leading wildcards)."""
        levels = filt.split("/")
        out = []

        def collect(node: _Node, topic_start: bool):
            stack = [(node, topic_start)]
            while stack:
                nd, first = stack.pop()
                if nd.message is not None:
                    out.append(nd.message)
                for name, child in nd.children.items():
                    if first and name.startswith("$"):
                        continue
                    stack.append((child, False))

        def walk(node: _Node, i: int):
            if i == len(levels):
                if node.message is not None:
                    out.append(node.message)
                return
            level = levels[i]
            if level == "#":
                # '#' matches the parent level too (4.7.1.2)
                if i > 0 and node.message is not None:
                    out.append(node.message)
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):  # [MQTT-4.7.2-1]
                        continue
                    collect(child, False)
                return
            if level == "+":
                for name, child in node.children.items():
                    if i == 0 and name.startswith("$"):  # [MQTT-4.7.2-1]
                        continue
                    walk(child, i + 1)
                return
            child = node.children.get(level)
            if child is not None:
                walk(child, i + 1)

        walk(self.root, 0)
        return out

    def all(self):
        out = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.message is not None:
                out.append(nd.message)
            stack.extend(nd.children.values())
        return out


__all__ = ["RetainedStore", "matches"]
