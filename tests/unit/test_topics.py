"""Topic matching (section 4.7) in the leaf package mqtt_topics, shared by broker and sink: properties."""
import ast
import pathlib

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import mqtt_topics
from mqtt_topics import TopicTrie, matches, parse_shared, valid_topic_filter, valid_topic_name

LEVEL = st.text(alphabet="ab$ é", max_size=3)            # may be empty: "a//b" has an empty level
TOPIC_LEVELS = st.lists(LEVEL, min_size=1, max_size=5)


def join(levels):
    return "/".join(levels)


@st.composite
def topic_and_matching_filter(draw):
    """A topic and a filter built from it: some levels replaced by '+', maybe a suffix by '#'."""
    levels = draw(TOPIC_LEVELS)
    filt = [("+" if draw(st.booleans()) else lv) for lv in levels]
    cut = draw(st.none() | st.integers(0, len(levels)))
    if cut is not None:
        filt = filt[:cut] + ["#"]   # 'a/#' also matches 'a' (4.7.1.2)
    return join(levels), join(filt)


@settings(max_examples=400, deadline=None)
@given(topic_and_matching_filter())
def test_filter_built_from_a_topic_matches_it(tf):
    topic, filt = tf
    assume(valid_topic_name(topic))
    assert valid_topic_filter(filt)
    leading_wildcard = filt[:1] in ("+", "#")
    # [MQTT-4.7.2-1] a filter starting with a wildcard does not match a topic starting with '$'
    assert matches(filt, topic) is not (topic.startswith("$") and leading_wildcard)


@settings(max_examples=300, deadline=None)
@given(TOPIC_LEVELS, st.data())
def test_a_different_literal_level_does_not_match(levels, data):
    topic = join(levels)
    i = data.draw(st.integers(0, len(levels) - 1))
    other = list(levels)
    other[i] = levels[i] + "x"
    assert not matches(join(other), topic)
    assert not matches(join(levels + ["z"]), topic)          # longer filter without '#'
    if len(levels) > 1:
        assert not matches(join(levels[:-1]), topic)         # shorter filter without '#'


FILTERS = st.lists(st.lists(st.sampled_from(["a", "b", "", "$s", "+"]), min_size=1, max_size=3)
                   .flatmap(lambda lv: st.sampled_from([lv, lv + ["#"]])).map(join),
                   max_size=12, unique=True)


@settings(max_examples=300, deadline=None)
@given(FILTERS, st.lists(st.sampled_from(["a", "b", "", "$s"]), min_size=1, max_size=4).map(join))
def test_trie_agrees_with_matches(filters, topic):
    """The router's trie finds exactly the filters `matches` accepts (one matcher, two shapes)."""
    t = TopicTrie()
    for f in filters:
        assert t.add(f, "k", f)
    found = sorted(v for d in t.match(topic) for v in d.values())
    assert found == sorted(f for f in filters if matches(f, topic))
    for f in filters:
        assert t.remove(f, "k")
    assert t.match(topic) == [] and not t.root.children      # empty branches are pruned
    assert t.root.children is mqtt_topics.NOTHING            # and their dicts freed


def test_a_node_holds_dicts_only_for_what_it_has():
    """A filter's nodes share one read-only empty mapping for the children or values they do not
    have (a device's own filter: 128 bytes less), and stay usable when they get some."""
    from broker.core.retain import RetainedStore
    t = TopicTrie()
    t.add("dev/7/cmd", "c7", 1)
    mid = t.root.children["dev"].children["7"]
    leaf = mid.children["cmd"]
    assert mid.values is mqtt_topics.NOTHING and leaf.children is mqtt_topics.NOTHING
    t.add("dev/7", "c8", 2)          # the middle node gets a value, the leaf a child
    t.add("dev/7/cmd/x", "c9", 3)
    assert sorted(v for d in t.match("dev/7") for v in d.values()) == [2]
    assert sorted(v for d in t.match("dev/7/cmd/x") for v in d.values()) == [3]
    assert t.remove("dev/7", "c8") and mid.values is mqtt_topics.NOTHING
    r = RetainedStore()
    r.set("a/b", "m")
    assert r.root.children["a"].children["b"].children is mqtt_topics.NOTHING
    r.set("a/b", None)
    assert r.root.children is mqtt_topics.NOTHING and r.match("#") == []


@given(st.text(alphabet="ab", min_size=1, max_size=3), TOPIC_LEVELS)
def test_shared_subscription_round_trip(group, levels):
    filt = join(levels)
    assume(filt)
    assert parse_shared(f"$share/{group}/{filt}") == (group, filt)   # 4.8.2


def test_leaf_imports_nothing_from_broker_or_sink():
    tree = ast.parse(pathlib.Path(mqtt_topics.__file__).read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("broker", "sink")], names


def test_matching_leaves_no_reference_cycles():
    """A topic's match (the subscription trie for every PUBLISH, the retained store for every
    SUBSCRIBE) is freed by reference counting: no garbage waits for the collector, which runs
    seldom in the broker (process.tune_gc). A recursive closure did: it kept each topic's levels,
    60 KB for a 60 KB topic, until a collection."""
    import gc

    from broker.core.retain import RetainedStore
    trie, retained = TopicTrie(), RetainedStore()
    for f in ("a/+/c", "a/#", "#", "+/b/+", "$SYS/#"):
        trie.add(f, f, 1)
    for t in ("a/b/c", "a/x", "$SYS/up", "z"):
        retained.set(t, t)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for i in range(200):
            assert trie.match(f"a/{i}/c")
            assert retained.match("a/#") and retained.match("+/b/+") == ["a/b/c"]
        left = gc.collect()
    finally:
        if was:
            gc.enable()
    assert left < 200, f"{left} objects in reference cycles after 200 matches of each kind"
