"""Claims of client ids: the last claim in the control topic owns the client id (cluster/control.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.core.durability import Pending

    from . import control as C

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
