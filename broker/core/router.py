"""Subscriptions -> matching sessions: the topic trie, $share groups and a match cache."""
from __future__ import annotations

from .topics import TopicTrie

CACHE_LIMIT = 100_000


class Router:
    def __init__(self):
        self.trie = TopicTrie()
        self.cache: dict[str, tuple] = {}
        self.next_member: dict[tuple, int] = {}
        self.count = 0

    def add(self, sub) -> bool:
        """Add or replace a subscription [MQTT-3.8.4-3]; True when it is new."""
        key = sub.session.client_id if sub.group is None else (sub.group, sub.session.client_id)
        new = self.trie.add(sub.topic_filter, key, sub)
        self.count += new
        self.cache.clear()
        return new

    def remove(self, sub) -> bool:
        key = sub.session.client_id if sub.group is None else (sub.group, sub.session.client_id)
        removed = self.trie.remove(sub.topic_filter, key)
        self.count -= removed
        self.cache.clear()
        return removed

    def match(self, topic: str) -> tuple[list, list]:
        """([(session, [subscriptions])], [(group key, [subscriptions])]) for a topic; cached."""
        hit = self.cache.get(topic)
        if hit is not None:
            return hit
        per_session: dict = {}
        groups: dict = {}
        for values in self.trie.match(topic):
            for sub in values.values():
                if sub.group is None:
                    subs = per_session.get(sub.session)
                    if subs is None:
                        per_session[sub.session] = [sub]
                    else:
                        subs.append(sub)
                else:
                    groups.setdefault((sub.group, sub.topic_filter), []).append(sub)
        hit = (list(per_session.items()), list(groups.items()))
        if len(self.cache) >= CACHE_LIMIT:
            self.cache.clear()
        self.cache[topic] = hit
        return hit

    def pick(self, key, members: list):
        """One member of a shared subscription group, round robin, preferring connected sessions."""
        n = len(members)
        start = self.next_member.get(key, 0)
        for i in range(n):
            sub = members[(start + i) % n]
            if sub.session.link is not None:
                self.next_member[key] = (start + i + 1) % n
                return sub
        self.next_member[key] = (start + 1) % n
        return members[start % n]
