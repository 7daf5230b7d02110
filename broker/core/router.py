"""Subscriptions -> matching sessions: the topic trie, $share groups and a match cache."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mqtt_topics import TopicTrie, wildcard_shape

if TYPE_CHECKING:
    from .session import Subscriber, Subscription

GroupKey = tuple[str, str]  # a $share group: (group name, topic filter)
# Router.match(): ([(session, its subscriptions)], [(group key, its members)])
Match = tuple[list[tuple["Subscriber", list["Subscription"]]], list[tuple[GroupKey, list["Subscription"]]]]

CACHE_ENTRIES = 100_000
CACHE_BYTES = 16 << 20
MISS_TOPIC_MAX = 256  # a topic nobody subscribes to is cached only when shorter than this
# the match of a topic nobody subscribes to: one shared object, so a cache of misses costs no
# allocation, and nothing to free. Never changed, as every match the cache hands out
NO_MATCH: Match = ([], [])
CLEAR_AT_ONCE = 4096  # a larger cache is not freed at once when emptied: sweep() frees it
SWEEP_ENTRIES = 20_000  # entries of emptied caches sweep() frees per call (Broker.tick, 1/s)


class Router:
    def __init__(self, cache_entries: int = CACHE_ENTRIES, cache_bytes: int = CACHE_BYTES) -> None:
        self.trie = TopicTrie()
        # topic -> match result; bounded by entries and by total topic length, emptied
        # when either bound is reached (cheaper than LRU on the hot path) and on any
        # subscription change
        self.cache: dict[str, Match] = {}
        self.cache_size = 0  # sum of len(topic) over the cache's keys
        self.cache_entries = cache_entries
        self.cache_bytes = cache_bytes if cache_entries > 0 else 0  # 0 entries: no cache
        self.next_member: dict[GroupKey, int] = {}
        self.count = 0
        # (group, topic filter) -> members: which $share groups have members here (a cluster
        # runs a stream per group); shared_version changes whenever a group gains or loses one
        self.shared_groups: dict[GroupKey, int] = {}
        self.shared_count = 0  # the $share subscriptions among `count`
        self.shared_version = 0
        # the filters of the plain (not $share) subscriptions here -> how many have each; the
        # version changes whenever a filter gains its first one or loses its last (a cluster
        # node tells the others which topics it wants: cluster/interest.py)
        self.plain_filters: dict[str, int] = {}
        self.plain_version = 0
        # emptied caches waiting to be freed (at most one: freeing 100,000 entries at once held
        # the event loop 10-17 ms, in the SUBSCRIBE or PUBLISH that emptied the cache)
        self.retired: list[dict[str, Match]] = []
        # What the subscriptions here cost, for the broker-wide bounds a SUBSCRIBE is checked
        # against (docs/conformance.md "Subscription limits"): the filters' length (mqtt.
        # max_subscription_bytes_total); the wildcard shapes (mqtt_topics.wildcard_shape) ->
        # how many subscriptions have each, and the sum of their wildcard levels (mqtt.
        # max_wildcard_levels_total), which bounds the trie nodes one PUBLISH can visit.
        # Why bound shapes rather than change the matcher: a topic matches at most one node per
        # shape prefix, so the walk is already no more than the distinct shapes' levels (plus
        # one literal node per topic level), and the common subscriptions (literal levels,
        # '#' tails, many filters of one shape) cost nothing against the bounds. Unbounded, one
        # SUBSCRIBE of 1,000 filters of 128 levels branching into '+' made every PUBLISH on a
        # new 128-level topic visit 118,000 nodes (94 ms, pure Python); within one session's
        # default (256 levels) it visits at most about 380 (0.24 ms), within the broker-wide
        # default (2048) about 2,200 (1.3 ms) (bench/stall.py wildcard_branches). The hot path
        # (match(), its cache) is unchanged: only add() and remove() count.
        self.filter_bytes = 0
        self.shapes: dict[str, int] = {}
        self.wildcard_levels = 0

    def add(self, sub: Subscription) -> bool:
        """Add or replace a subscription [MQTT-3.8.4-3]; True when it is new."""
        key = sub.session.client_id if sub.group is None else (sub.group, sub.session.client_id)
        new = self.trie.add(sub.topic_filter, key, sub)
        self.count += new
        if new:
            self.filter_bytes += len(sub.filter)
            if "+" in sub.topic_filter:
                self.count_shape(sub.topic_filter, 1)
        if new and sub.group is None:
            n = self.plain_filters.get(sub.topic_filter, 0)
            self.plain_filters[sub.topic_filter] = n + 1
            if not n:
                self.plain_version += 1
        if new and sub.group is not None:
            g = (sub.group, sub.topic_filter)
            self.shared_groups[g] = self.shared_groups.get(g, 0) + 1
            self.shared_count += 1
            self.shared_version += 1
        self.empty_cache()
        return new

    def count_shape(self, topic_filter: str, delta: int) -> None:
        shape, levels = wildcard_shape(topic_filter)
        n = self.shapes.get(shape, 0) + delta
        if n > 0:
            self.shapes[shape] = n
            if n == delta:  # new here
                self.wildcard_levels += levels
        else:
            self.shapes.pop(shape, None)
            self.wildcard_levels -= levels

    def wildcard_room(self, topic_filter: str, limit: int) -> bool:
        """Whether one more subscription to topic_filter keeps the wildcard levels of the
        distinct shapes subscribed within limit (mqtt.max_wildcard_levels_total; 0: no bound)."""
        if not limit or "+" not in topic_filter:
            return True
        shape, levels = wildcard_shape(topic_filter)
        return shape in self.shapes or self.wildcard_levels + levels <= limit

    def has_plain(self) -> bool:
        """Whether any subscription here is not a $share one."""
        return self.count > self.shared_count

    def remove(self, sub: Subscription) -> bool:
        key = sub.session.client_id if sub.group is None else (sub.group, sub.session.client_id)
        removed = self.trie.remove(sub.topic_filter, key)
        self.count -= removed
        if removed:
            self.filter_bytes -= len(sub.filter)
            if "+" in sub.topic_filter:
                self.count_shape(sub.topic_filter, -1)
        if removed and sub.group is None:
            n = self.plain_filters.get(sub.topic_filter, 1) - 1
            if n:
                self.plain_filters[sub.topic_filter] = n
            else:
                self.plain_filters.pop(sub.topic_filter, None)
                self.plain_version += 1
        if removed and sub.group is not None:
            g = (sub.group, sub.topic_filter)
            n = self.shared_groups.get(g, 1) - 1
            if n:
                self.shared_groups[g] = n
            else:
                self.shared_groups.pop(g, None)
            self.shared_count -= 1
            self.shared_version += 1
        self.empty_cache()
        return removed

    def empty_cache(self) -> None:
        """Start a new cache; a large old one is freed later, a slice at a time (sweep())."""
        old = self.cache
        self.cache_size = 0
        if len(old) <= CLEAR_AT_ONCE:
            old.clear()
            return
        self.cache = {}
        if self.retired:  # one is still being freed: it goes now (memory stays bounded)
            self.retired.pop().clear()
        self.retired.append(old)

    def sweep(self, entries: int = SWEEP_ENTRIES) -> None:
        """Free up to `entries` entries of emptied caches (called once a second)."""
        while self.retired and entries > 0:
            old = self.retired[-1]
            n = min(entries, len(old))
            entries -= n
            for _ in range(n):
                old.popitem()
            if not old:
                self.retired.pop()

    def match(self, topic: str) -> Match:
        """([(session, [subscriptions])], [(group key, [subscriptions])]) for a topic; cached."""
        hit = self.cache.get(topic)
        if hit is not None:
            return hit
        per_session: dict[Subscriber, list[Subscription]] = {}
        groups: dict[GroupKey, list[Subscription]] = {}
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
        hit = (list(per_session.items()), list(groups.items())) if per_session or groups \
            else NO_MATCH
        n = len(topic)
        if (per_session or groups or n < MISS_TOPIC_MAX) and n <= self.cache_bytes >> 4:
            if len(self.cache) >= self.cache_entries or self.cache_size + n > self.cache_bytes:
                self.empty_cache()
            self.cache[topic] = hit
            self.cache_size += n
        return hit

    def pick(self, key: GroupKey, members: list[Subscription]) -> Subscription:
        """One member of a shared subscription group (4.8.2: each message to one session), round
        robin, preferring connected sessions."""
        n = len(members)
        start = self.next_member.get(key, 0)
        for i in range(n):
            sub = members[(start + i) % n]
            if sub.session.connection is not None:
                self.next_member[key] = (start + i + 1) % n
                return sub
        self.next_member[key] = (start + 1) % n
        return members[start % n]
