"""Claims of client ids (cluster/node.py ClusterNode.admit): a CONNECT writes a claim on its
client id to the control topic and waits for it to be applied; the last claim in the log owns
the client id (cluster/control.py). A session that lived on another node waits for its last
owner's final state (cluster.handoff_timeout), then is rebuilt here (cluster/rebuild.py).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable

from broker.core.durability import Pending
from broker.core.hooks import AdmitRefused

from . import control as C
from . import records as R

if TYPE_CHECKING:
    from broker.core.hookhost import HookHost
    from broker.protocol.packets import Will
    from settings import ClusterConfig

log = logging.getLogger(__name__)

NOT_AUTHORIZED = 0x87  # CONNACK reason code
UNAVAILABLE = "the cluster's Kafka did not confirm this connection in time; try again"


class Claim:
    """A CONNECT waiting for its claim on its client id to be applied (and its session
    rebuilt here, if it lived elsewhere)."""
    __slots__ = ("token", "cid", "clean", "deadline", "client")

    def __init__(self, token: Pending, cid: str, clean: bool, deadline: float) -> None:
        self.token = token
        self.cid = cid
        self.clean = clean
        self.deadline = deadline
        # the claim as applied (ControlState): set before the claim is acted on (cluster/rebuild.py)
        self.client: C.Client = None  # type: ignore[assignment]


class Claims:
    """The CONNECTs of this node waiting for their claims. `state`: the control state (the
    clients, this node's id and incarnation); `write`: a control record to write; `next_id`: the
    node's next number (of its claims and messages); `rebuild`: a session that lived elsewhere,
    rebuilt here; `counters`: claims, takeovers."""

    def __init__(self, cfg: ClusterConfig, wall: Callable[[], float],
                 state: Callable[[], C.ControlState | None],
                 write: Callable[[str, dict | None], None], next_id: Callable[[], int],
                 rebuild: Callable[[Claim], None], counters: dict[str, int]) -> None:
        self.cfg = cfg
        self.wall = wall
        self.state = state
        self.write = write
        self.next_id = next_id
        self.rebuild = rebuild
        self.counters = counters
        self.broker: HookHost = None  # type: ignore[assignment]  # ClusterNode.attach()
        self.waiting: dict[str, Claim] = {}      # req -> a CONNECT waiting for its claim
        self.handoffs: dict[str, Claim] = {}     # cid -> a claim waiting for the last owner

    def admit(self, client_id: str, clean_start: bool, expiry: int, will: Will | None,
              username: str | None) -> Pending | AdmitRefused:
        """A claim on the client id, written; its token resolves once it is applied (and the
        session rebuilt here, if it lived elsewhere)."""
        st = self.state()
        assert st is not None
        if self.broker.cfg.session_owner_check and self.others_session(client_id, username):
            # as the core refuses it for a session on this node (Connection.accept), before the
            # claim: a claim would take the session from its owner, wherever it is
            return AdmitRefused(NOT_AUTHORIZED, "this client id is in use by another user's "
                                                "session")
        token = Pending()
        req = f"{st.inc}:{self.next_id()}"
        self.waiting[req] = Claim(token, client_id, clean_start,
                                  time.monotonic() + self.cfg.connect_timeout)
        rec = C.claim_record(st.node, st.inc, req, clean_start, expiry,
                             R.will_to_dict(will, self.wall()), username)
        self.write(f"c:{client_id}", rec)
        return token

    def others_session(self, client_id: str, username: str | None) -> bool:
        """The client id has a session in the cluster (connected, or offline and not expired)
        that another user made."""
        st = self.state()
        c = st.clients.get(client_id) if st is not None else None
        if c is None or c.user == username:
            return False
        return c.connected or (c.expiry > 0 and (c.expires_at is None or c.expires_at > self.wall()))

    def claimed(self, ev: C.Claimed) -> None:
        """A claim of this node's incarnation was applied."""
        c = ev.client
        claim = self.waiting.pop(ev.req, None)
        if claim is None:
            return
        st = self.state()
        assert st is not None
        claim.client = c
        self.counters["claims"] += 1
        if ev.prev is not None and (ev.prev.node != st.node or ev.prev.inc != st.inc):
            self.counters["takeovers"] += 1
        local = self.broker.session_of(c.cid)
        if not claim.clean and local is None and c.session is not None:
            if c.handed_over:
                self.rebuild(claim)
            else:
                claim.deadline = time.monotonic() + self.cfg.handoff_timeout
                self.handoffs[c.cid] = claim
            return
        claim.token.resolve()

    def handed_over(self, cid: str) -> None:
        """The last owner wrote the session's final state: rebuilt here now."""
        claim = self.handoffs.pop(cid, None)
        if claim is not None:
            self.rebuild(claim)

    def expire(self, now: float) -> None:
        """Claims not applied in time fail; sessions whose last owner said nothing in time are
        rebuilt from their last checkpoint."""
        for req, claim in list(self.waiting.items()):
            if now > claim.deadline:
                del self.waiting[req]
                claim.token.resolve(UNAVAILABLE)
        for cid, claim in list(self.handoffs.items()):
            if now > claim.deadline:  # the last owner said nothing: from its last checkpoint
                del self.handoffs[cid]
                log.info("cluster: no final state for %r from its last node within %.1f s; "
                         "resuming it from its last checkpoint", cid[:100], self.cfg.handoff_timeout)
                self.rebuild(claim)

    def fail_all(self) -> None:
        """This node was fenced: every CONNECT waiting fails (the client tries again)."""
        for claim in list(self.waiting.values()) + list(self.handoffs.values()):
            claim.token.resolve(UNAVAILABLE)
        self.waiting.clear()
        self.handoffs.clear()
