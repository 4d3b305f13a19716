"""The producer contract: the cut-off between ackgate and a broker's I/O."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from ackgate._contract.message import Message
from ackgate._contract.outcome import AdvanceItem, AdvanceRun, EventBatch
from ackgate._contract.progress import SubscriberProgress
from ackgate._contract.stats import BrokerLag
from ackgate._contract.upstream import Upstream


class SharedStreamProducer(ABC):
    """One upstream poll shared by every subscriber of a group, and the way back to the broker.

    ackgate creates a producer through the factory given to ``subscribe`` once per
    group, calls :meth:`open_stream` once, fans every yielded event out to the
    group's subscribers, and calls :meth:`advance` with events every subscriber has
    resolved. The obligations, all of which ackgate relies on:

    * **Lazy I/O.** Open the broker connection in :meth:`open_stream`, never in
      ``__init__`` or the factory, and keep it on ``self``: when polling is
      cancelled, the generator's ``finally`` runs *before* the last advances, so
      the connection must outlive it. Close it in :meth:`aclose`.
    * **Ordering.** Events of one lane (:meth:`get_advance_lane`) are handed to
      :meth:`advance` in the order :meth:`open_stream` yielded them.
    * **Failure is loud.** Raising from :meth:`advance` ends the whole group;
      nothing later is advanced on any lane, and the broker redelivers.
    * **Close once.** :meth:`aclose` is awaited exactly once, after the last
      :meth:`advance`, however the group ended.

    :meth:`to_message` is optional: a :class:`~ackgate.Service` calls it to turn each
    event into the :class:`~ackgate.Message` its handlers receive.

    :meth:`dead_letter_destination` is optional: a producer that stores rejected
    events somewhere (a dead-letter topic or queue) says where, so that a service
    may give up on poison messages (``give_up_after``) without dropping them.

    :meth:`open_stream_batches` is optional too: a producer whose broker fetches
    many events at once (Kafka) yields them as one :class:`~ackgate.EventBatch`,
    and the group then takes them in one step instead of one per event.

    **Outages.** A producer that rides out a lost connection (retrying its receive
    instead of raising) says so with :meth:`upstream_lost` and :meth:`upstream_back`;
    the group logs the outage once and shows it in ``GroupStats.upstream_connected``.
    """

    #: The connection state of the group reading this producer; set by the group
    #: (:meth:`_watch_upstream`) while it reads it, ``None`` otherwise.
    _upstream: Upstream | None = None
    #: What the roster members of the group reading this producer acked; set by the
    #: group (:meth:`_watch_subscriber_progress`) while it reads it, ``None`` otherwise.
    _subscriber_progress: SubscriberProgress | None = None

    @abstractmethod
    def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        """Yield ``(raw_event, broker_payload)`` pairs, forever or until raising.

        Write it as an async generator. Returning is treated as an error (the
        group ends and subscribers get ``StreamTerminated``); so is yielding
        anything but a 2-tuple (``StreamTerminated`` with the error as
        ``__cause__``). Cancellation arrives at a ``yield`` or an ``await``
        when the group stops; clean up in ``finally`` but keep the connection
        that :meth:`advance` needs.
        """

    def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        """Optional bulk form of :meth:`open_stream`: yield :class:`~ackgate.EventBatch` es.

        A producer that overrides it is read through it instead of
        :meth:`open_stream` (which it still implements, for readers of single
        events). The group handles each event of a batch exactly as if it had
        been yielded alone, in the batch's order: the same snapshots, ordering,
        room and resolution rules, and ``advance`` still receives one item per
        event. What changes is the cost: one step per batch where the
        group would otherwise take one per event, and the lane and ids come with
        the batch, so :meth:`get_advance_lane` and :meth:`get_event_id` are not
        called for these events. The batch's events share one broadcast instant.

        Everything :meth:`open_stream` promises holds here too (laziness,
        cancellation at a ``yield``, returning is an error). Yielding anything
        but an ``EventBatch`` with at least one event, equal lengths and a
        hashable lane ends the group (``StreamTerminated`` with the error as
        ``__cause__``). Keep batches to what one fetch returns: the group may wait
        for room between the events of a batch (backpressure, ``max_outstanding``), with the rest
        of the batch held in memory meanwhile.
        """
        raise NotImplementedError

    def to_messages(self, batch: EventBatch) -> list[Message]:
        """:meth:`to_message` for every event of ``batch``, in order. Override it when
        converting a whole batch is cheaper than one call per event."""
        to_message = self.to_message
        return [
            to_message(raw, payload)
            for raw, payload in zip(batch.raw_events, batch.broker_payloads, strict=True)
        ]

    @abstractmethod
    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Move the broker forward past ``batch``.

        ``batch`` is non-empty, holds events of one lane only, in the order they
        were yielded, and is that lane's contiguous fully-resolved prefix. The
        next batch of the lane is passed only after this call returned. At most
        one call per lane is in flight, and at most ``max_concurrent_advances``
        across lanes. A cumulative broker (Kafka) may commit only the last
        committable item. What each :class:`AdvanceOutcome` means for the broker
        (commit, dead-letter, redeliver) is the producer's decision.

        Raising ends the group: every subscriber gets ``AdvanceFailed`` with this
        exception as ``__cause__``. Cancellation: not cancelled by ackgate once
        started, except when the manager's own task is cancelled.
        """

    async def advance_runs(self, runs: Sequence[AdvanceRun]) -> None:
        """Optional bulk form of :meth:`advance`: the same events, as runs.

        A producer that overrides it is advanced through it instead of
        :meth:`advance`. ``runs`` is non-empty, holds runs of one lane only, in
        stream order, and together they are that lane's contiguous fully-resolved
        prefix: everything :meth:`advance` promises about its batch holds for the
        concatenation of the runs' events. Each :class:`~ackgate.AdvanceRun` gives
        one outcome for its events and lists only the events whose outcome differs,
        so a producer commits a clean run without looking at each event.

        The default expands the runs into items and calls :meth:`advance`.
        Raising and cancellation as in :meth:`advance`.
        """
        await self.advance([item for run in runs for item in run.items()])

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        """Return the ordering lane of ``broker_payload`` (default: one lane).

        Called once per event, synchronously, before fan-out; it must be O(1).
        Raising or returning an unhashable value ends the group with
        ``StreamTerminated`` (the error as ``__cause__``).
        """
        return None

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        """Return the broker's identity of the event, stable across redeliveries.

        Optional (default ``None``: no identity). When a copy of an event whose id
        was seen before in this group is broadcast again, every subscriber that
        acked an earlier copy is counted ``acked`` for it at once and not handed
        it (docs/concepts.md#redelivery-memory). Called once per event, synchronously, like
        :meth:`get_advance_lane`; raising or returning an unhashable value ends
        the group with ``StreamTerminated``. Return an id only if two payloads
        with equal ids really carry the same event.
        """
        return None

    def to_message(self, raw_event: Any, broker_payload: Any) -> Message:
        """Convert one yielded event into the :class:`~ackgate.Message` handlers receive.

        Called by a :class:`~ackgate.Service` once per event (not once per handler),
        synchronously, in the poll, before fan-out: keep it cheap. Raising ends the
        group (``StreamTerminated`` with the error as ``__cause__``); the service
        restarts it after a backoff, and the broker redelivers.

        The default accepts ``bytes`` raw events only: ``Message(body=raw_event, id=...,
        lane=self.get_advance_lane(broker_payload), raw=raw_event)``, no key, no headers, no
        delivery count; ``id`` is ``str(get_event_id(payload))`` when the producer gives ids
        (docs/concepts.md#redelivery-memory), else ``repr(broker_payload)``. Anything else is a
        ``TypeError`` naming the producer class. Adapters override it.
        """
        if not isinstance(raw_event, bytes):
            raise TypeError(
                f"{type(self).__name__} yields {type(raw_event).__name__} raw events; the "
                "default to_message() takes bytes only: override to_message() to convert them"
            )
        event_id = self.get_event_id(broker_payload)
        return Message(
            body=raw_event,
            id=repr(broker_payload) if event_id is None else str(event_id),
            lane=self.get_advance_lane(broker_payload),
            raw=raw_event,
        )

    #: The broker, as OpenTelemetry's messaging conventions name it in
    #: ``messaging.system`` (``"kafka"``, ``"aws_sqs"``, ``"gcp_pubsub"``,
    #: ``"servicebus"``); ``None`` (the default) is reported as ``"unknown"``. A class
    #: attribute: a :class:`~ackgate.Service` reads it once per group life to label the
    #: handlers' spans.
    messaging_system: str | None = None

    def destination_name(self) -> str | None:
        """The name of what this producer reads, for spans' ``messaging.destination.name``
        (a queue URL, a subscription, an entity): ``None`` (the default) when each
        message names its own (a Kafka record's topic) or there is none to tell.

        Called once per group life, synchronously, right after the factory made the
        producer: no I/O.
        """
        return None

    def dead_letter_destination(self) -> str | None:
        """Where :meth:`advance` stores a rejected event, for people: ``None`` if nowhere.

        A *rejected* event is one whose outcome has ``rejected >= 1`` and
        ``failed == 0``. Return a short description of the place (``"Kafka topic
        orders.dlq"``) when :meth:`advance` always stores such an event there, with
        its reasons, before moving the broker past it; return ``None`` (the
        default) when it does anything else (commits past it with a log line,
        hands it back to the broker's own redelivery or redrive policy).

        A :class:`~ackgate.Service` calls it once per group, synchronously, right
        after the factory made the producer (before :meth:`open_stream`): no I/O.
        A service with a handler that sets ``give_up_after`` refuses to start on a
        producer that returns ``None``: giving up must never drop a message.
        """
        return None

    def upstream_lost(self, address: str, cause: BaseException | str) -> None:
        """Report that the broker at ``address`` cannot be reached, because of ``cause``.

        Call it from the event loop's thread when a receive (or commit) fails in a
        way the producer rides out, retrying instead of raising. The first report of
        an outage logs one WARNING on ``ackgate.upstream`` naming ``key``,
        ``address`` and ``cause`` (an exception is shown as its type and message),
        and sets ``GroupStats.upstream_connected`` to ``False`` and
        ``upstream_down_since`` to the wall-clock time (``time.time()``); further
        reports until :meth:`upstream_back` change nothing, so calling it on every
        failed retry is fine. ``address`` is what an operator recognises (host and
        port, a queue URL, a namespace), never a credential. A no-op while no group
        reads the producer.
        """
        upstream = self._upstream
        if upstream is not None:
            upstream.lost(address, cause)

    def upstream_back(self) -> None:
        """Report that the broker answers again (a receive or a commit succeeded).

        Logs one INFO on ``ackgate.upstream`` with how long it was down and sets
        ``GroupStats.upstream_connected`` back to ``True``, if the upstream was
        reported lost; otherwise does nothing, so it may be called after every
        successful receive. Same thread rule as :meth:`upstream_lost`.
        """
        upstream = self._upstream
        if upstream is not None:
            upstream.back()

    def broker_lag(self) -> BrokerLag | None:
        """What the broker holds that this producer's group has not advanced past.

        Optional: the default, ``None``, means the producer does not measure it.
        Called by ``SharedStreamManager.stats()`` (so by health probes and metric
        collections, up to a few times a second) on the event loop: return the last
        measurement at once, never do I/O here. Refresh it in the stream's
        background at an interval of the producer's choosing (a request every few
        seconds, never one per message): Kafka's end offsets against the committed
        ones per partition, SQS's approximate counts of its queue.
        """
        return None

    def _watch_upstream(self, upstream: Upstream | None) -> None:
        """Caller: the group, when it starts reading this producer (and ``None`` once
        it closed it). A wrapping producer forwards it to the producer it wraps."""
        self._upstream = upstream

    def _watch_subscriber_progress(self, progress: SubscriberProgress | None) -> None:
        """Caller: the group, when it starts reading this producer (and ``None`` once
        it closed it): what each roster member acked, by event id, for a producer
        that records it with its advances and hands it back to the next group
        (:class:`~ackgate.SubscriberProgress`). A wrapping producer forwards it."""
        self._subscriber_progress = progress

    async def aclose(self) -> None:  # noqa: B027 - optional hook, empty by design
        """Release the broker connection. Best-effort.

        Awaited exactly once when the group ends, after the last :meth:`advance`.
        An exception is logged at WARNING on the ``ackgate`` logger, not raised.
        """


def overrides(producer: SharedStreamProducer, hook: str) -> bool:
    """Whether ``producer``'s class replaces :class:`SharedStreamProducer`'s optional
    ``hook`` (``"get_event_id"``, ``"open_stream_batches"``, ``"advance_runs"``, ...):
    callers take the path the hook serves only then, and the default's cost never."""
    return getattr(type(producer), hook) is not getattr(SharedStreamProducer, hook)
