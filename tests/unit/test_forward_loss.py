"""Noticing that Kafka lost data (sink/forward/loss.py LossDetector), alone: acknowledgements and
metadata in, why data was lost (or None) out."""
from sink.forward.loss import LossDetector


class Metadata:
    """Stands in for kafka_client's cluster metadata: topic -> id, refreshed at refreshed_ms."""

    def __init__(self, ids, refreshed_ms=1000.0):
        self.ids = ids
        self._last_successful_refresh_ms = refreshed_ms

    def topic_id(self, topic):
        return self.ids.get(topic)


def ack(d, topic, base, n, md=None):
    return d.acknowledged({(topic, 0): base}, {(topic, 0): n}, md or Metadata({topic: "A"}))


def test_an_offset_going_back_in_an_acknowledgement_is_data_lost():
    d = LossDetector()
    after, lost, unknown = ack(d, "m", 0, 5)
    assert after == {("m", 0): 5} and lost is None and not unknown
    assert ack(d, "m", 5, 3)[1] is None                 # the next offsets: nothing lost
    _, lost, _ = ack(d, "m", 2, 1)                      # below the last written (7): Kafka lost it
    assert lost == "offset of m/0 went back from 7 to 2"
    assert d.offsets == {"m/0": 2}                      # what is written from now on


def test_offsets_kept_in_the_checkpoint_notice_a_loss_after_a_restart():
    before = LossDetector()
    ack(before, "m", 0, 10)
    after = LossDetector(before.state())                # a restarted forwarder, its checkpoint loaded
    assert ack(after, "m", 0, 1)[1] == "offset of m/0 went back from 9 to 0"


def test_a_topic_id_changing_in_the_metadata_is_data_lost():
    d = LossDetector({"topic_ids": {"m": "A", "n": ""}})
    assert d.check_ids(Metadata({"m": "A", "n": "N"})) is None    # unknown ids are learnt
    assert d.topic_ids == {"m": "A", "n": "N"}
    assert d.check_ids(Metadata({"m": "B", "n": "N"})) == "topic m was re-created (topic id A -> B)"
    assert d.topic_ids["m"] == "B" and d.check_ids(Metadata({"m": "B", "n": "N"})) is None


def test_metadata_older_than_the_replay_is_not_compared():
    """After a replay the ids are those of the new Kafka: metadata cached from before it says
    nothing (it would name the old ids)."""
    d = LossDetector({"topic_ids": {"m": "A"}})
    d.restart(Metadata({"m": "B"}, refreshed_ms=5000.0), 5000.0)
    assert d.topic_ids == {"m": "B"}
    assert d.check_ids(Metadata({"m": "A"}, refreshed_ms=4000.0)) is None and d.topic_ids == {"m": "B"}
    assert d.check_ids(Metadata({"m": "C"}, refreshed_ms=6000.0)) == "topic m was re-created (topic id B -> C)"


def test_a_topic_acknowledged_before_the_metadata_names_it_asks_for_metadata():
    d = LossDetector()
    after, lost, unknown = ack(d, "m", 0, 2, Metadata({}))
    assert unknown and lost is None and d.ids_of(after) == {"m": None}
    assert d.names_every_topic(Metadata({})) is False
    assert d.check_ids(Metadata({"m": "A"})) is None and d.ids_of(after) == {"m": "A"}
    assert d.names_every_topic(Metadata({"m": "A"})) is True
