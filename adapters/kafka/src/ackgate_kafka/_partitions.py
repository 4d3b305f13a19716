"""What the Kafka adapter keeps per record and per partition.

:class:`Delivery` is the broker payload of one record; :class:`PartitionState` is this
consumer's view of one assigned partition: its epoch, which makes deliveries fetched
before a hold or a revoke stale, and the offsets yielded and committed in it. The
rules that use them are described in :mod:`ackgate_kafka._producer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


class Delivery(NamedTuple):
    """The broker payload: the record, its partition and the epoch it was fetched in.

    A NamedTuple because one is built per record on the hot path.
    """

    tp: Any
    record: Any
    epoch: int


@dataclass(slots=True)
class PartitionState:
    """This consumer's view of one partition.

    Invariants: only deliveries whose ``epoch`` equals ``self.epoch`` are ever
    committed, and only while ``owned`` (checked under the producer's lock);
    ``committed_next`` only grows within one assignment (asserted in ``_commit``). The
    epoch changes on every assignment, revocation and hold. Tests:
    ``test_acked_commits_once_per_batch_and_failed_is_held_then_redelivered``,
    ``test_rebalance_drains_resolved_prefix_and_never_commits_revoked``,
    ``test_consumer_joins_and_leaves_mid_stream``.
    """

    epoch: int
    owned: bool = True
    draining: bool = False
    # Offset after the last record yielded in this epoch; None if none yet.
    yielded_next: int | None = None
    # Offset after the last commit this consumer made in this assignment.
    committed_next: int | None = None
    # Offset of the last hold; repeated holds at the same offset log at DEBUG only, so a
    # group whose subscribers are all force-failed does not flood the log.
    held_at: int | None = None
    # Set when the coordinator refused a commit because the group rebalanced under this
    # assignment (after an outage longer than the session): nothing more can be
    # committed in it, so a revoke has nothing to wait for.
    refused: bool = False

    def drained(self) -> bool:
        """True when everything yielded in this epoch is committed (or can never be)."""
        return (
            not self.owned
            or self.refused
            or self.yielded_next is None
            or (self.committed_next is not None and self.committed_next >= self.yielded_next)
        )

    def new_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.yielded_next = None
