"""The advance side of the Kafka producer: partition ownership, commits, holds, the DLQ.

:class:`PartitionOwner` keeps this consumer's view of its partitions
(:class:`~ackgate_kafka._partitions.PartitionState`) and carries out what
:mod:`ackgate_kafka._advance` decides for each advance: DLQ writes, then one commit
(or hold) under the lock that a revoke also takes. The rules are described in
:mod:`ackgate_kafka._producer`; :mod:`ackgate_kafka._fetch` builds on this class.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ackgate import AdvanceItem, AdvanceOutcome, AdvanceRun, SharedStreamProducer
from ackgate_kafka._advance import AdvancePlan, as_runs, plan
from ackgate_kafka._dead_letter import dead_letter_headers
from ackgate_kafka._membership import MembershipKeeper
from ackgate_kafka._offset_map import OffsetRuns, encode
from ackgate_kafka._partitions import Delivery, PartitionState
from ackgate_kafka._refusals import refusal

log = logging.getLogger("ackgate.adapters.kafka")

# Seconds a refresh of the offset maps may take (``PartitionOwner._refresh_maps``).
_REFRESH_COMMIT_TIMEOUT = 5.0


class PartitionOwner(SharedStreamProducer):
    """Partition ownership and the way back to the broker; the state is set up by
    :class:`~ackgate_kafka.KafkaStreamProducer`'s constructor."""

    _bootstrap_servers: str | Sequence[str]
    _group_id: str
    _dlq_topic: str | None
    _drain_timeout: float
    _consumer: Any
    _dlq: Any
    _errors: Any
    _partitions: dict[Any, PartitionState]
    _epochs: itertools.count[int]
    # Held around every ownership check that is followed by a commit or seek, so a
    # revoke can never complete between the check and the broker call.
    _lock: asyncio.Lock
    # Set after every commit or hold; a draining revoke waits on it.
    _progress: asyncio.Event
    _keeper: MembershipKeeper | None
    # Longest offset map a commit carries (``offset_map_max_bytes``).
    _map_max_bytes: int

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit past the batch's resolved prefix; dead-letter rejects; hold at a failure.

        The items are taken as runs of equal consecutive outcomes, exactly as
        :meth:`advance_runs` takes them. Raises ``RuntimeError``/``ConnectionError``
        (chained to aiokafka's error) when a commit or DLQ write fails, after logging
        the partition and offsets involved. Not cancelled by ackgate once started; if
        it is cancelled anyway, whatever was not committed is redelivered.
        """
        await self.advance_runs(as_runs(batch))

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        """:meth:`advance` by runs: one commit per call, as there. A clean run (no
        exceptions, every delivery of the partition's current epoch) costs the same
        whatever its length: the commit target is its last offset + 1. A run with
        exceptions, or one straddling two epochs, is decided event by event, exactly
        as :meth:`advance` decides its items. Errors and cancellation as in
        :meth:`advance`."""
        tp = runs[0].broker_payloads[0].tp
        part = self._partitions[tp]
        epoch = part.epoch
        decided = plan(runs, epoch, part.assigned_epoch)
        if decided.stale:
            log.debug(
                "%d deliveries of %s-%d from an earlier epoch (refetched after a hold or "
                "revoked): not committed, recorded as finished if clean",
                decided.stale,
                tp.topic,
                tp.partition,
            )
        if decided.rejected:
            await self._dead_letter_all(tp, decided)
        async with self._lock:
            if not part.owned or part.epoch != epoch:
                if decided.commit_to is not None or decided.hold_at is not None:
                    log.info(
                        "Not committing %s-%d: partition revoked or refetched meanwhile; "
                        "its owner reads from the last committed offset",
                        tp.topic,
                        tp.partition,
                    )
                return
            for start, end in decided.finished:
                part.finish(start, end)
            hold_at, commit_to = decided.hold_at, decided.commit_to
            if hold_at is None and commit_to is not None:
                # Finished offsets right after the clean prefix were never yielded again
                # (or were, and their copies resolved before them): commit past them too.
                commit_to = part.finished.take_from(commit_to)
            target = hold_at if hold_at is not None else commit_to
            if part.refused:
                return
            if target is not None and (part.committed_next is None or target > part.committed_next):
                await self._commit(tp, part, target)
            elif decided.finished and part.committed_next is not None:
                # The commit is held: a metadata-only commit keeps the map current, so
                # a restart does not replay what was finished meanwhile.
                await self._commit(tp, part, part.committed_next)
            if hold_at is not None and not part.refused:
                self._hold(tp, part, hold_at)
        self._progress.set()

    async def _dead_letter_all(self, tp: Any, decided: AdvancePlan) -> None:
        """Write the plan's rejected records to the DLQ and wait for every acknowledgement
        (without ``dlq_topic``: a WARNING per record, which is then committed past)."""
        if self._dlq is None:
            for delivery, _ in decided.rejected:
                log.warning(
                    "Rejected event %s-%d@%d committed past without a DLQ (no dlq_topic)",
                    tp.topic,
                    tp.partition,
                    delivery.record.offset,
                )
            return
        writes = [
            await self._dead_letter(delivery, outcome) for delivery, outcome in decided.rejected
        ]
        try:
            await asyncio.gather(*writes)
        except self._errors.KafkaError as exc:
            log.error(
                "DLQ write to %s failed for %s-%d before offset %s; not committing: %r",
                self._dlq_topic,
                tp.topic,
                tp.partition,
                decided.commit_to,
                exc,
            )
            raise self._translate(exc, "DLQ write failed") from exc

    async def _dead_letter(self, delivery: Delivery, outcome: AdvanceOutcome) -> Any:
        """Queue the DLQ copy; return the future of its acknowledgement."""
        record = delivery.record
        headers = dead_letter_headers(record, outcome)
        try:
            return await self._dlq.send(
                self._dlq_topic, value=record.value, key=record.key, headers=headers
            )
        except self._errors.KafkaError as exc:
            log.error(
                "DLQ write to %s failed for %s-%d@%d: %r",
                self._dlq_topic,
                record.topic,
                record.partition,
                record.offset,
                exc,
            )
            raise self._translate(exc, "DLQ write failed") from exc

    def _metadata(self, tp: Any, part: PartitionState, offset: int) -> tuple[str, bool]:
        """The offset map of a commit of ``tp`` at ``offset``, with what each roster
        member acked past it (``ackgate.SubscriberProgress``), and whether all of it
        fit ``offset_map_max_bytes``."""
        progress = self._subscriber_progress
        members: dict[str, list[tuple[int, int]]] = {}
        if progress is not None:
            acked = progress.acked_offsets((tp.topic, tp.partition), offset)
            members = {m: runs for m, runs in acked.items() if isinstance(m, str)}
        return encode(
            tp.topic,
            tp.partition,
            offset,
            part.finished,
            part.seen_next,
            part.counts,
            members,
            self._map_max_bytes,
        )

    def _overflowed(self, tp: Any, part: PartitionState, offset: int) -> None:
        """A commit's map did not fit: counted (``GroupStats.progress_overflows``),
        logged once per assignment."""
        progress = self._subscriber_progress
        if progress is not None:
            progress.progress_overflowed()
        if not part.overflowed:
            part.overflowed = True
            log.warning(
                "The offset map of %s-%d@%d does not fit %d characters: what lies "
                "farthest past the commit is left out, and is delivered again after a "
                "restart or rebalance (duplicates). Raise offset_map_max_bytes (and the "
                "broker's offset.metadata.max.bytes) to keep more",
                tp.topic,
                tp.partition,
                offset,
                self._map_max_bytes,
            )

    async def _refresh_maps(self, interval: float) -> None:
        """Every ``interval`` seconds, commit the committed offset of each owned
        partition with events delivered past it and no commit for ``interval`` again where
        its map changed (members acked more since), all in one request: a lane that
        cannot advance (a slow handler, a held offset) still records what the other
        members finished past it, and a lane that advances pays nothing more (each of
        its commits carries the map). Errors are left to the next advance's commit,
        which raises them."""
        while True:
            await asyncio.sleep(interval)
            upstream = self._upstream
            if self._subscriber_progress is None or (
                upstream is not None and not upstream.connected
            ):
                continue  # in an outage, the advance that follows it commits the map
            async with self._lock:
                changed = {}
                stale = time.monotonic() - interval
                for tp, part in self._partitions.items():
                    offset = part.committed_next
                    if (
                        offset is None
                        or part.committed_at > stale
                        or part.seen_next <= offset  # nothing delivered past it
                        or not part.owned
                        or part.draining
                        or part.refused
                    ):
                        continue
                    metadata, complete = self._metadata(tp, part, offset)
                    if metadata != part.metadata:
                        if not complete:
                            self._overflowed(tp, part, offset)
                        changed[tp] = (offset, metadata)
                if not changed:
                    continue
                try:
                    # Bounded: the lock it holds is the one a revoke waits for.
                    async with asyncio.timeout(_REFRESH_COMMIT_TIMEOUT):
                        await self._consumer.commit(changed)
                except TimeoutError:
                    log.debug("Offset map refresh timed out group=%s", self._group_id)
                    continue
                except self._errors.CommitFailedError:
                    for tp in changed:
                        self._partitions[tp].refused = True  # as in _commit
                    self._progress.set()  # a draining revoke need not wait for them now
                    continue
                except self._errors.KafkaError as exc:
                    log.debug("Offset map refresh failed group=%s: %r", self._group_id, exc)
                    continue
                now = time.monotonic()
                for tp, (_, metadata) in changed.items():
                    self._partitions[tp].metadata = metadata
                    self._partitions[tp].committed_at = now

    async def _commit(
        self, tp: Any, part: PartitionState, offset: int, map_: tuple[str, bool] | None = None
    ) -> None:
        """Commit ``tp`` at ``offset`` with its offset map (``map_``, if made already)."""
        assert part.owned and (part.committed_next is None or offset >= part.committed_next)
        metadata, complete = self._metadata(tp, part, offset) if map_ is None else map_
        if not complete:
            self._overflowed(tp, part, offset)
        try:
            await self._consumer.commit({tp: (offset, metadata)})
        except self._errors.CommitFailedError:
            # The group rebalanced under this assignment (an outage outlasted the
            # session): aiokafka rejoins, the revoke ends this assignment, and the
            # partition's owner (maybe this consumer again) reads from the last
            # committed offset. Nothing is skipped: deliveries of this epoch are stale.
            part.refused = True
            log.info(
                "Kafka commit refused group=%s %s-%d offset=%d: the group rebalanced "
                "meanwhile; the partition is read again from its last committed offset",
                self._group_id,
                tp.topic,
                tp.partition,
                offset,
            )
            return
        except self._errors.KafkaError as exc:
            log.error(
                "Kafka commit failed group=%s %s-%d offset=%d (last committed %s): %r",
                self._group_id,
                tp.topic,
                tp.partition,
                offset,
                part.committed_next,
                exc,
            )
            raise self._translate(exc, "commit failed") from exc
        part.committed(offset)
        part.metadata = metadata
        part.committed_at = time.monotonic()

    def _hold(self, tp: Any, part: PartitionState, offset: int) -> None:
        part.new_epoch(next(self._epochs))
        # A draining partition is about to go to its new owner, who starts at the
        # committed offset (this one) anyway; seeking an outgoing partition is moot.
        if not part.draining:
            self._consumer.seek(tp, offset)
        log.log(
            logging.DEBUG if part.held_at == offset else logging.INFO,
            "Holding %s-%d at offset %d (failed or unsubscribed); redelivering from there",
            tp.topic,
            tp.partition,
            offset,
        )
        part.held_at = offset

    def _own(self, tp: Any) -> PartitionState:
        """Return ``tp``'s state, starting a new assignment if it was not owned.

        Called from the assignment callback and, in case a fetch races ahead of that
        callback, from the poll loop; idempotent while owned.
        """
        part = self._partitions.get(tp)
        if part is None:
            epoch = next(self._epochs)
            part = self._partitions[tp] = PartitionState(epoch=epoch, assigned_epoch=epoch)
        elif not part.owned:
            part.new_epoch(next(self._epochs))
            part.assigned_epoch = part.epoch
            part.owned = True
            part.committed_next = None
            part.held_at = None
            part.map_loaded = False
            part.announce = True
            part.finished = OffsetRuns()
            part.refused = False
            part.overflowed = False
            part.metadata = None
        else:
            return part
        log.info("Partition assigned %s-%d group=%s", tp.topic, tp.partition, self._group_id)
        return part

    async def _on_revoked(self, revoked: Iterable[Any]) -> None:
        parts = {tp: self._partitions[tp] for tp in revoked if tp in self._partitions}
        if not parts:
            return
        for part in parts.values():
            part.draining = True
        try:
            async with asyncio.timeout(self._drain_timeout):
                while not all(part.drained() for part in parts.values()):
                    self._progress.clear()
                    await self._progress.wait()
        except TimeoutError:
            undrained = sorted(
                f"{tp.topic}-{tp.partition}@{part.committed_next}<{part.yielded_next}"
                for tp, part in parts.items()
                if not part.drained()
            )
            log.warning(
                "Rebalance drain timed out after %.1fs group=%s; uncommitted ranges are "
                "redelivered to the new owner: %s",
                self._drain_timeout,
                self._group_id,
                ", ".join(undrained),
            )
        async with self._lock:
            for part in parts.values():
                part.owned = False
                part.draining = False
                part.new_epoch(next(self._epochs))
        self._progress.set()
        log.info(
            "Partitions revoked group=%s: %s",
            self._group_id,
            ", ".join(sorted(f"{tp.topic}-{tp.partition}" for tp in parts)),
        )

    @property
    def _address(self) -> str:
        """The bootstrap servers, as a refusal names them."""
        servers = self._bootstrap_servers
        return servers if isinstance(servers, str) else ",".join(servers)

    def _translate(self, exc: BaseException, what: str) -> Exception:
        """``exc`` as what ends the group: the broker's refusal (credentials, ACLs),
        which a service does not retry, or an error naming the group and servers."""
        client = getattr(self._consumer, "_client", None)
        refused = refusal(self._errors, exc, client, self._address)
        if refused is not None:
            return refused
        message = f"Kafka {what} (group={self._group_id!r}, servers={self._bootstrap_servers!r})"
        if isinstance(exc, self._errors.KafkaConnectionError):
            return ConnectionError(f"{message}: cannot reach the cluster: {exc}")
        return RuntimeError(f"{message}: {exc!r}")
