"""Keep the consumer in its group while ``open_stream`` is suspended at a ``yield``
(docs/writing-an-adapter.md#1-the-producer).

aiokafka leaves the consumer group when no ``getmany`` call has been in progress for
``max_poll_interval_ms``. ackgate may leave the stream suspended at a ``yield`` for
as long as backpressure or a paused rostered group lasts, so a
:class:`MembershipKeeper` task watches how long the stream has been away from
``getmany`` and, past a third of ``max_poll_interval_ms``, polls on its behalf: it
pauses every assigned partition and calls ``getmany`` with a short timeout until the
stream wants to fetch again, then resumes what it paused.

State machine (one task, ``_run``)::

    WATCHING --(stream away from getmany >= idle_limit)--> KEEPING
    KEEPING  --(stream calls wake() / close())----------> WATCHING (partitions resumed)
    KEEPING  --(getmany raised)-------------------------> FAILED (error kept for the stream)

Invariants: ``getmany`` is called by the stream only while ``keeping`` is False and by
the keeper only while ``keeping`` is True and the stream is suspended — never both at
once (``wake()`` returns only after the keeper's last ``getmany`` returned). Every
partition the keeper paused is in ``_paused`` and is resumed when it stops, if still
assigned. No record fetched while keeping is lost: the keeper seeks each partition that
returned records back to the first of them (and pauses it), so the stream fetches them
again. Test: ``tests/adapters/kafka/test_kafka_suspended.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("ackgate.adapters.kafka")

# Timeout of each getmany while keeping: bounds how long wake() waits.
_KEEPALIVE_POLL_MS = 200


class MembershipKeeper:
    """Polls with every partition paused while the stream is suspended at a yield.

    Caller: ``KafkaStreamProducer.open_stream`` (``fetch_started``/``fetch_ended``
    around its own ``getmany``, ``wake()`` before it, ``close()`` in its ``finally``)
    and the rebalance listener (``assigned``).
    """

    def __init__(self, consumer: Any, errors: Any, max_poll_interval_ms: int, group: str) -> None:
        self._consumer = consumer
        self._errors = errors
        self._group = group
        # A third of the interval: the keeper is polling long before aiokafka gives up.
        self._idle_limit = max_poll_interval_ms / 3000
        self._poll_ms = max(1, min(_KEEPALIVE_POLL_MS, max_poll_interval_ms // 10))
        self._loop = asyncio.get_running_loop()
        self._fetching = False
        self._fetch_ended = self._loop.time()
        self.keeping = False
        self.error: BaseException | None = None
        self._stop = False
        self._stopped = asyncio.Event()
        self._paused: set[Any] = set()
        self._task: asyncio.Task[None] | None = None
        # Counts for tests and logs: times the keeper took over, records sought back.
        self.suspensions = 0
        self.sought_back = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"ackgate-kafka-keeper-{self._group}")

    def fetch_started(self) -> None:
        assert not self.keeping, "the stream fetches only after wake()"
        self._fetching = True

    def fetch_ended(self) -> None:
        self._fetching = False
        self._fetch_ended = self._loop.time()

    async def wake(self) -> None:
        """Called by the stream before it fetches again: stop keeping, resume partitions.

        Returns once the keeper's last ``getmany`` returned (within ~200 ms). Raises
        the error that ended keeping, if any. Cancellation: the keeper still stops
        and resumes the partitions on its own; the stream is being torn down anyway.
        """
        if self.keeping:
            self._stop = True
            await self._stopped.wait()
        if self.error is not None:
            raise self.error

    def assigned(self, partitions: Iterable[Any]) -> None:
        """Rebalance listener: partitions assigned while keeping are paused too."""
        if self.keeping:
            # Even ones paused before: a new assignment starts every partition unpaused.
            tps = list(partitions)
            self._consumer.pause(*tps)
            self._paused.update(tps)

    async def close(self) -> None:
        """Stop the keeper (from the stream's ``finally``); waits for its ``getmany``."""
        task, self._task = self._task, None
        if task is None:
            return
        if self.keeping:
            self._stop = True
            try:
                await asyncio.shield(self._stopped.wait())
            except asyncio.CancelledError:
                task.cancel()
                raise
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            if self._fetching:
                await asyncio.sleep(self._idle_limit)
                continue
            delay = self._fetch_ended + self._idle_limit - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            if not await self._keep():
                return

    async def _keep(self) -> bool:
        """Poll with everything paused until woken; False if polling failed."""
        self.keeping = True
        self._stop = False
        self._stopped.clear()
        self.suspensions += 1
        log.info(
            "Stream suspended for %.1fs group=%s; polling with every partition paused to "
            "stay in the group",
            self._loop.time() - self._fetch_ended,
            self._group,
        )
        try:
            self.assigned(self._consumer.assignment())
            while not self._stop:
                fetched = await self._consumer.getmany(timeout_ms=self._poll_ms)
                for tp, records in fetched.items():
                    # Assigned between the rebalance callback and now, or buffered:
                    # fetch these again once the stream resumes.
                    if records:
                        self._consumer.seek(tp, records[0].offset)
                        self.sought_back += len(records)
                    self.assigned([tp])
            return True
        except self._errors.KafkaError as exc:
            log.error("Kafka poll failed while suspended group=%s: %r", self._group, exc)
            self.error = exc
            return False
        finally:
            self._resume()
            self.keeping = False
            self._fetch_ended = self._loop.time()
            self._stopped.set()

    def _resume(self) -> None:
        paused, self._paused = self._paused, set()
        assignment = self._consumer.assignment()
        still = [tp for tp in paused if tp in assignment]
        if still:
            self._consumer.resume(*still)
        log.info("Stream resumed group=%s; %d partitions resumed", self._group, len(still))
