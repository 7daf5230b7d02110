"""The history job's check of the broker's record signatures (kafka_client/headers.py H_SIG).

Any process that can reach Kafka can write records; only the broker's forwarder knows the key
(settings/secrets.py), so only its records carry a valid ``mqtt.sig``. A record without one is
dropped before it becomes a row, and counted: unsigned (another producer), signed with another
key (a broker with another data directory), or forged (a signature that does not match).

Works on kafka_client.recordbatch.Decoded columns: where each record's signed bytes start and end is
computed with numpy for all records; the per-record work is one HMAC.
"""
from __future__ import annotations

import hmac
import logging
import struct
from dataclasses import dataclass, field

import numpy as np

from kafka_client.headers import H_SIG, SIG_LEN, signature_mac
from kafka_client.recordbatch import Decoded, key_matches

log = logging.getLogger(__name__)

_PREFIX = struct.Struct(">H")
_TS = struct.Struct(">q")
_NAME = H_SIG.encode()


@dataclass
class Verdicts:
    """Records dropped by the signature check, by reason."""
    unsigned: int = 0
    other_key: int = 0
    forged: int = 0
    examples: list = field(default_factory=list)   # (reason, offset) of the first few

    @property
    def dropped(self) -> int:
        return self.unsigned + self.other_key + self.forged

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.unsigned, "without a signature (written by "
                                                "another producer)"),
                                               (self.other_key, "signed with another broker's key "
                                                "(a broker with another data directory?)"),
                                               (self.forged, "with a signature that does not "
                                                "match (altered or forged)")) if n]
        return ", ".join(parts)


def _varint_size(n: np.ndarray) -> np.ndarray:
    """Bytes of the zigzag varint of each n."""
    z = ((n << 1) ^ (n >> 63)).astype(np.uint64)
    size = np.ones(len(n), np.int64)
    for bits in range(7, 64, 7):
        size += z >= np.uint64(1 << bits)
    return size


def signed(d: Decoded, topic: str, key: bytes, kid: bytes, verdicts: Verdicts) -> np.ndarray:
    """Boolean mask of the records of ``d`` (read from Kafka topic ``topic``) that carry the
    broker's valid signature; the others are counted in ``verdicts``."""
    n = len(d)
    ok = np.zeros(n, bool)
    if n == 0:
        return ok
    counts = np.diff(d.hoff)
    has = counts > 0
    last = np.where(has, d.hoff[1:] - 1, 0)
    if len(d.hkey[0]):
        is_sig = key_matches(d, _NAME)[last] & has & (d.hvalue[1][last] == SIG_LEN)
    else:
        is_sig = np.zeros(n, bool)
    cand = np.flatnonzero(is_sig)
    verdicts.unsigned += n - len(cand)
    if n - len(cand) and len(verdicts.examples) < 5:
        verdicts.examples.append(("unsigned", int(d.offset[np.flatnonzero(~is_sig)[0]])))
    if not len(cand):
        return ok
    k_start, k_len = d.key[0][cand], d.key[1][cand]
    begin = (k_start - _varint_size(k_len)).tolist()
    end = (d.hkey[0][last[cand]] - 1).tolist()      # the header's 1-byte name length varint
    sig = d.hvalue[0][last[cand]].tolist()
    ts = d.timestamp[cand].tolist()
    buf = memoryview(d.data)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs lack __buffer__)
    tb = topic.encode()
    head = _PREFIX.pack(len(tb)) + tb
    klen = len(kid)
    keyed = signature_mac(key)
    for j, i in enumerate(cand.tolist()):
        s = sig[j]
        if buf[s:s + klen] != kid:
            verdicts.other_key += 1
            continue
        h = keyed.copy()
        h.update(b"".join((head, _TS.pack(ts[j]), buf[begin[j]:end[j]])))
        mac = h.digest()
        if hmac.compare_digest(mac[:SIG_LEN - klen], buf[s + klen:s + SIG_LEN]):
            ok[i] = True
        else:
            verdicts.forged += 1
            if len(verdicts.examples) < 5:
                verdicts.examples.append(("forged", int(d.offset[i])))
    return ok
