"""A session moved to this node (cluster/rebuild.py): how far the node that wrote its checkpoint
had read, which this node reads to before it rebuilds the session (else its live stream would
give the session again what the last node had already delivered [MQTT-4.3.3-3])."""
from __future__ import annotations

from cluster.rebuild import checkpoint_upto


def test_a_checkpoint_says_how_far_its_node_had_read_in_each_partition():
    ck = {"pos": {"0": 10, "1": 40}, "next": {"0": 12},
          "subs": [["a/#", 1, 0, 0, 0, None, {"1": 45}], ["b", 2, 0, 0, 0, None, None],
                   ["c", 0, 0, 0, 0, None]],
          "carried": {"h": "x", "n": 2, "upto": {"2": 7}}}
    assert checkpoint_upto(ck) == {0: 12, 1: 45, 2: 7}


def test_a_session_without_a_checkpoint_waits_for_nothing():
    assert checkpoint_upto({}) == {}
    assert checkpoint_upto({"pos": {}, "next": {}, "subs": []}) == {}
