"""Random interleavings of everything that can happen to a group, checked after every step.

A model predicts, for every event, exactly which subscribers are in its snapshot and how each
resolves it; the producer checks every advance against the model when it is called. Invariants
(docs/writing-an-adapter.md#1-the-producer, docs/concepts.md#window,
docs/concepts.md#the-guarantee):

* advances within a lane come in fan-out order, each batch is a contiguous
  prefix of one lane, and no event is advanced twice;
* an event is advanced only after every subscriber in its snapshot resolved it,
  with outcome counts equal to the model's (so they sum to the snapshot size);
* at most one advance in flight per lane and at most ``max_concurrent_advances``
  overall; nothing is advanced after an advance raised;
* outputs resolved later (deferred resolution): ``confirm_persisted``, ``reject_bound`` and
  ``fail_bound`` resolve the bound event for its subscriber, the first one wins,
  and each outcome's ``reasons`` are the rejecting subscribers' reasons in
  subscription order;
* the memory bound: at most ``max_outstanding`` events are broadcast and not advanced; the poll
  pulls an event only while below it, and is never held back while below it;
* the fake clock: moving the fake clock expires what fell due, with no pull or broadcast;
* batches (``pull_batch``): a subscriber takes up to ``n`` queued events under one
  number and holds the ``BoundBatch``; later ``confirm_persisted`` acks every event
  of it, ``reject_bound`` / ``fail_bound`` resolve those not resolved yet,
  ``reject_in_batch`` rejects some by index (out of range: ignored), a force-fail
  (ack timeout, overflow) fails what it still owes, and leaving resolves nothing;
  the model predicts every event's outcome exactly, as for single outputs;
* the batch poll: a group's producer (drawn per group) yields single events or
  ``EventBatch`` es of one lane (``open_stream_batches``); every event of a batch
  must be broadcast exactly as if yielded alone (snapshots, overflow, the memory bound), which
  the model checks when the group reads it (``RawEvents``);
* runs: the group reads each run of a batch as one slice of its raw events (the
  model records the runs there); every event of a run is still handled exactly as if
  yielded alone, and a run is advanced once every event of it is resolved;
* liveness: when a group stops, every event resolved before the stop whose lane
  predecessors and run were resolved too has been advanced; and from whatever state a rule
  reaches (``everyone_keeps_pulling``), once the advances are let through, every
  output is confirmed and every active subscriber keeps pulling, the group is
  quiescent within a bounded number of pulls: what the producer yields is broadcast
  and handed out, and every event broadcast is advanced (or an advance raised, and
  the group ended with ``AdvanceFailed``).

``ACKGATE_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 2000).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from collections.abc import Sequence as SequenceABC
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ackgate import (
    AckTimeout,
    AdvanceFailed,
    AdvanceItem,
    EventBatch,
    SharedStreamManager,
    StreamTerminated,
    SubscriberOverflow,
    Subscription,
)
from ackgate.testing import FakeClock, ScriptedProducer

EXAMPLES = int(os.environ.get("ACKGATE_HYPOTHESIS_EXAMPLES", "2000"))
# Ack timeout in fake seconds. The fake clock drives every expiry: moving it fires
# each group's timer (docs/testing.md#fakeclock), and pulls and broadcasts notice it too.
ACK_TIMEOUT = 1e6
#: The smallest queue a run draws (``queue_size``): with 8 the batch poll (``batched``)
#: broadcasts two events per run between its loop turns, with 3 one.
QUEUE_SIZE = 3
QUEUE_SIZES = (QUEUE_SIZE, 8)
NAMES = ("s0", "s1", "s2")
REASONS = (None, "bad row", "poison")


@dataclass
class MEvent:
    id: int
    lane: int
    broadcast_at: float
    snapshot: set[str]
    resolved: dict[str, str] = field(default_factory=dict)
    #: Reject reasons by token: (subscription order, "<subscriber_id>: <reason>").
    reasons: dict[str, tuple[int, str]] = field(default_factory=dict)
    resolved_step: int | None = None
    advanced: bool = False

    def counts(self) -> tuple[int, int, int]:
        values = list(self.resolved.values())
        return values.count("acked"), values.count("failed"), values.count("rejected")


@dataclass
class Generation:
    """One group's lifetime: one producer, its events and its members."""

    producer: CheckingProducer
    events: dict[int, MEvent] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    lanes: dict[int, list[int]] = field(default_factory=dict)
    next_to_advance: dict[int, int] = field(default_factory=dict)
    in_flight_lanes: set[int] = field(default_factory=set)
    members: dict[str, MSub] = field(default_factory=dict)
    #: Fed to the producer, not pulled by the poll yet (it waits at max_outstanding).
    backlog: deque[tuple[int, int]] = field(default_factory=deque)
    terminal: type[StreamTerminated] | None = None
    terminal_step: int | None = None
    advance_failed: bool = False
    #: The run each event was broadcast in (its events' ids), as the group read it:
    #: a run is advanced once all of it is resolved. Events yielded alone: absent.
    run_of: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class MSub:
    token: str
    order: int
    name: str
    sub: Subscription
    gen: Generation
    state: str = "active"  # active | failed | left
    failure: type[Exception] | None = None
    queue: deque[int] = field(default_factory=deque)
    current: int | None = None
    current_resolved: bool = False
    bindings: dict[int, set[int]] = field(default_factory=dict)
    closed_windows: set[int] = field(default_factory=set)
    #: Batches it pulled (``pull_batch``) and holds, by their one number.
    batches: dict[int, MBatch] = field(default_factory=dict)


@dataclass
class MBatch:
    """A ``BoundBatch`` a subscriber holds: its events, in stream order, under one seq."""

    seq: int
    msub: MSub
    events: list[int]
    #: Events rejected alone (``reject_in_batch``): the seq no longer resolves them.
    apart: set[int] = field(default_factory=set)

    def remaining(self) -> list[int]:
        return [event_id for event_id in self.events if event_id not in self.apart]


class CheckingProducer(ScriptedProducer):
    def __init__(self, machine: GroupMachine) -> None:
        super().__init__(lane=lambda payload: payload[0])
        self.machine = machine
        self.generation: Generation | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        async for item in super().open_stream():
            assert self.generation is not None
            with self.machine.recording():
                self.machine.pulled(self.generation)  # the poll broadcasts it right after
            yield item

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        assert self.generation is not None
        with self.machine.recording():
            self.machine.advance_started(self.generation, batch)
        ok = False
        try:
            await super().advance(batch)
            ok = True
        finally:
            self.machine.advance_ended(self.generation, batch, ok)


class BatchingProducer(CheckingProducer):
    """Read through ``open_stream_batches``: what it is fed (``feed_item``) are
    ``EventBatch`` es of one lane whose raw events are :class:`RawEvents`."""

    async def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        async for batch in ScriptedProducer.open_stream(self):
            yield batch


class RawEvents(SequenceABC[str]):
    """The raw events of a fed ``EventBatch``. The group reads each one when it
    broadcasts it, so reading one tells the model (``pulled``) that it is broadcast
    now, as the per-event producer does when the poll pulls an event: from there
    on each event must be handled exactly as if it had been yielded alone."""

    def __init__(self, producer: CheckingProducer, event_ids: list[int]) -> None:
        self.producer = producer
        self.event_ids = event_ids
        self.read = 0  # events read so far: the model was told of each, in order

    def __len__(self) -> int:
        return len(self.event_ids)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            # The group reads a run's events as one slice when it broadcasts the run.
            read = [self[i] for i in range(*index.indices(len(self)))]
            gen = self.producer.generation
            assert gen is not None
            run = [self.event_ids[i] for i in range(*index.indices(len(self)))]
            for event_id in run:
                gen.run_of[event_id] = run
            return read
        event_id = self.event_ids[index]
        gen = self.producer.generation
        assert gen is not None
        machine = self.producer.machine
        with machine.recording():
            while self.read <= index:
                machine.pulled(gen, self.event_ids[self.read])
                self.read += 1
        return f"raw-{event_id}"


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.step = 0
        self.subs: list[MSub] = []
        self.seqs: list[int] = []
        self.binding_of: dict[int, tuple[MSub, int]] = {}
        #: Live batch numbers (``pull_batch``); ``batch_seqs`` also keeps the stale ones.
        self.batch_of: dict[int, MBatch] = {}
        self.batch_seqs: list[int] = []
        self.generations: list[Generation] = []
        self.gen: Generation | None = None
        self.tokens = 0
        self.next_event = 0
        self.cap = 1
        self.lanes = 1
        self.max_outstanding = 1
        self.queue_size = QUEUE_SIZE
        self.gate = asyncio.Event()
        self.gate.set()
        self.manager: SharedStreamManager | None = None
        #: Checks that failed inside the producer, where raising would only end the group.
        self.violations: list[AssertionError] = []

    # -- plumbing ------------------------------------------------------------------

    @contextmanager
    def recording(self) -> Iterator[None]:
        try:
            yield
        except AssertionError as violation:
            self.violations.append(violation)
            raise

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 5))

    def call(self, fn: Any, *args: Any) -> Any:
        """Call a synchronous API inside the loop, as a handler would."""

        async def inside() -> Any:
            return fn(*args)

        return self.run(inside())

    def settle(self) -> None:
        async def turns() -> None:
            for _ in range(40):
                await asyncio.sleep(0)

        self.run(turns())

    def teardown(self) -> None:
        try:
            self.gate.set()
            self.settle()  # what the gate held (advances, a poll waiting for room) runs now
            for msub in list(self.subs):
                if msub.state != "left":
                    self.leave_model(msub, crashed=False)
                    self.run(msub.sub.aclose())
                    self.settle()  # a quiet loop: the next leave's model moves first
            assert self.manager is not None
            self.run(self.manager.aclose())
            self.settle()
            for gen in self.generations:
                self.check_liveness(gen)
        finally:
            self.loop.close()

    # -- the model -----------------------------------------------------------------

    def resolve(
        self,
        gen: Generation,
        event_id: int,
        token: str,
        how: str,
        by: MSub | None = None,
        reason: str | None = None,
    ) -> None:
        event = gen.events[event_id]
        assert token in event.snapshot and token not in event.resolved, (event, token, how)
        event.resolved[token] = how
        if how == "rejected" and reason is not None:
            assert by is not None
            event.reasons[token] = (by.order, f"{by.name}: {reason}")
        if len(event.resolved) == len(event.snapshot):
            event.resolved_step = self.step

    def force_fail(self, msub: MSub, failure: type[Exception]) -> None:
        gen = msub.gen
        if msub.state == "active":
            msub.state = "failed"
        msub.failure = failure
        if msub.current is not None and not msub.current_resolved:
            msub.current_resolved = True
            self.resolve(gen, msub.current, msub.token, "failed")
            self.drop_bindings(msub, [msub.current])
        for event_id in list(msub.bindings):
            if event_id in msub.closed_windows:
                self.resolve(gen, event_id, msub.token, "failed")
        self.drop_bindings(msub, list(msub.bindings))
        for seq in list(msub.batches):
            self.resolve_batch(seq, "failed")
        for event_id in msub.queue:
            self.resolve(gen, event_id, msub.token, "failed")
        msub.queue.clear()

    def resolve_batch(self, seq: int, how: str, reason: str | None = None) -> None:
        """A live batch number resolves every event of its batch not rejected apart."""
        batch = self.batch_of.pop(seq, None)
        if batch is None:
            return  # stale: resolved, rejected apart entirely, or its holder force-failed
        msub = batch.msub
        del msub.batches[seq]
        for event_id in batch.remaining():
            self.resolve(msub.gen, event_id, msub.token, how, msub, reason)

    def drop_bindings(self, msub: MSub, event_ids: list[int]) -> None:
        for event_id in event_ids:
            for seq in msub.bindings.pop(event_id, set()):
                self.binding_of.pop(seq, None)
            msub.closed_windows.discard(event_id)

    def check_timeouts(self, gen: Generation) -> None:
        if gen.producer.closed:
            return  # the group stopped: what was unresolved is abandoned, nothing expires
        for event_id in gen.order:
            event = gen.events[event_id]
            if len(event.resolved) < len(event.snapshot):
                if self.clock() - event.broadcast_at >= ACK_TIMEOUT:
                    self.expire(gen)
                return

    def expire(self, gen: Generation) -> None:
        now = self.clock()
        for event_id in gen.order:
            event = gen.events[event_id]
            if len(event.resolved) == len(event.snapshot):
                continue
            if now - event.broadcast_at < ACK_TIMEOUT:
                return
            owers = [m for m in self.subs if m.gen is gen and m.token in event.snapshot]
            for msub in owers:
                if msub.token not in event.resolved:
                    self.force_fail(msub, AckTimeout)

    def close_window(self, msub: MSub) -> None:
        current = msub.current
        if current is None:
            return
        msub.current = None
        if msub.current_resolved:
            return
        if msub.bindings.get(current):
            msub.closed_windows.add(current)
        else:
            msub.bindings.pop(current, None)
            self.resolve(msub.gen, current, msub.token, "acked")

    def terminate(self, gen: Generation, kind: type[StreamTerminated]) -> None:
        if gen.terminal is not None:
            return
        gen.terminal = kind
        gen.terminal_step = self.step
        for msub in gen.members.values():
            if msub.state == "active":
                for event_id in msub.queue:
                    self.resolve(gen, event_id, msub.token, "failed")
                msub.queue.clear()

    def leave_model(self, msub: MSub, *, crashed: bool) -> None:
        gen = msub.gen
        if msub.state == "active":
            if msub.current is not None and not msub.current_resolved:
                if crashed:
                    msub.current_resolved = True
                    self.drop_bindings(msub, [msub.current])
                    self.resolve(gen, msub.current, msub.token, "failed")
                    msub.current = None
                else:
                    self.close_window(msub)
            msub.current = None
            for event_id in msub.queue:
                self.resolve(gen, event_id, msub.token, "failed")
            msub.queue.clear()
        msub.state = "left"
        del gen.members[msub.name]
        if not gen.members:
            self.gate.set()  # the last leave waits for the final advances
            self.terminate(gen, StreamTerminated)

    # -- the producer's checks -----------------------------------------------------

    def advance_started(self, gen: Generation, batch: Sequence[AdvanceItem]) -> None:
        assert not gen.advance_failed, "advance started after an advance raised"
        assert batch, "empty batch"
        lanes = {item.broker_payload[0] for item in batch}
        assert len(lanes) == 1, f"batch spans lanes {lanes}"
        [lane] = lanes
        assert lane not in gen.in_flight_lanes, "two advances in flight on one lane"
        assert len(gen.in_flight_lanes) < self.cap, "more advances in flight than the cap"
        start = gen.next_to_advance.get(lane, 0)
        expected = gen.lanes[lane][start : start + len(batch)]
        assert [item.broker_payload[1] for item in batch] == expected, "not the lane's prefix"
        for item in batch:
            event = gen.events[item.broker_payload[1]]
            assert not event.advanced, "advanced twice"
            assert len(event.resolved) == len(event.snapshot), f"unresolved: {event}"
            outcome = item.outcome
            assert (outcome.acked, outcome.failed, outcome.rejected) == event.counts(), (
                outcome,
                event,
            )
            reasons = tuple(text for _, text in sorted(event.reasons.values()))
            assert outcome.reasons == reasons, (outcome, event)
            assert outcome.acked + outcome.failed + outcome.rejected == len(event.snapshot)
        gen.in_flight_lanes.add(lane)

    def advance_ended(self, gen: Generation, batch: Sequence[AdvanceItem], ok: bool) -> None:
        lane = batch[0].broker_payload[0]
        gen.in_flight_lanes.discard(lane)
        if not ok:
            gen.advance_failed = True
            self.terminate(gen, AdvanceFailed)
            return
        for item in batch:
            gen.events[item.broker_payload[1]].advanced = True
        gen.next_to_advance[lane] = gen.next_to_advance.get(lane, 0) + len(batch)

    def check_liveness(self, gen: Generation) -> None:
        if gen.advance_failed or gen.terminal_step is None:
            return

        def resolved_in_time(event_id: int) -> bool:
            step = gen.events[event_id].resolved_step
            return step is not None and step <= (gen.terminal_step or 0)

        for lane, ids in gen.lanes.items():
            for event_id in ids:
                # A run is advanced as one unit: once every event of it is resolved.
                if not all(map(resolved_in_time, gen.run_of.get(event_id, [event_id]))):
                    break
                event = gen.events[event_id]
                assert event.advanced, f"lane {lane}: resolved {event} never advanced"

    # -- rules ---------------------------------------------------------------------

    @initialize(
        cap=st.integers(1, 3),
        lanes=st.integers(1, 4),
        max_outstanding=st.sampled_from([1, 2, 4, 65536]),
        queue_size=st.sampled_from(QUEUE_SIZES),
    )
    def start(self, cap: int, lanes: int, max_outstanding: int, queue_size: int) -> None:
        self.cap, self.lanes, self.max_outstanding = cap, lanes, max_outstanding
        self.queue_size = queue_size

        async def make() -> SharedStreamManager:
            return SharedStreamManager(
                ack_timeout=ACK_TIMEOUT,
                subscriber_queue_size=queue_size,
                max_concurrent_advances=cap,
                clock=self.clock,
                max_outstanding=max_outstanding,
            )

        self.manager = self.run(make())

    def live(self) -> list[MSub]:
        return [m for m in self.subs if m.state != "left"]

    @rule(name=st.sampled_from(NAMES), batched=st.booleans())
    def subscribe(self, name: str, batched: bool) -> None:
        """Join the group, or start the next one: its producer yields single events or,
        ``batched``, ``EventBatch`` es (``open_stream_batches``)."""
        assert self.manager is not None
        gen = self.gen
        if gen is None or gen.terminal is not None:
            producer = (BatchingProducer if batched else CheckingProducer)(self)
            producer.advance_gate = self.gate
            gen = Generation(producer)
            producer.generation = gen
            self.generations.append(gen)
            self.gen = gen
        manager = self.manager

        async def subscribe() -> Subscription:
            return manager.subscribe("key", name, producer=lambda: gen.producer)

        if name in gen.members:
            try:
                self.run(subscribe())
            except ValueError:
                return
            raise AssertionError("a duplicate live subscriber was accepted")
        sub = self.run(subscribe())
        self.tokens += 1
        msub = MSub(f"{name}#{self.tokens}", self.tokens, name, sub, gen)
        gen.members[name] = msub
        self.subs.append(msub)
        self.settle()

    def outstanding(self, gen: Generation) -> int:
        return sum(1 for e in gen.events.values() if not e.advanced)

    @precondition(lambda self: self.gen is not None and self.gen.terminal is None)
    @rule(lane=st.integers(0, 3), count=st.sampled_from([1, 1, 2, 3, 4]))
    def producer_yields(self, lane: int, count: int = 1) -> None:
        """The producer yields ``count`` events of one lane: one by one, or as one
        ``EventBatch`` if the group reads batches."""
        gen = self.gen
        assert gen is not None
        lane %= self.lanes
        event_ids = list(range(self.next_event, self.next_event + count))
        self.next_event += count
        pulled_now = not gen.backlog and self.outstanding(gen) < self.max_outstanding
        gen.backlog.extend((event_id, lane) for event_id in event_ids)
        # The model moved first: the broadcast (``pulled``) may cause advances at once.
        if isinstance(gen.producer, BatchingProducer):
            payloads = [(lane, event_id) for event_id in event_ids]
            raws = RawEvents(gen.producer, event_ids)
            gen.producer.feed_item(EventBatch(raws, payloads, lane))
        else:
            for event_id in event_ids:
                gen.producer.feed(f"raw-{event_id}", (lane, event_id))
        if pulled_now:
            self.run(self.taken(gen))
        self.settle()

    async def taken(self, gen: Generation) -> None:
        """Until the poll took what was fed, or waits for room at ``max_outstanding``."""
        while gen.backlog and gen.terminal is None:
            if self.outstanding(gen) >= self.max_outstanding:
                return
            await asyncio.sleep(0)

    def pulled(self, gen: Generation, read: int | None = None) -> None:
        """Caller: the producer, when the poll pulls the next event (broadcast next),
        or a batch's ``RawEvents`` when the group reads event ``read`` to broadcast it."""
        if gen.terminal is not None:
            # The poll being torn down took one more item (its cancellation landed
            # at the next await): it checks the group ended and never broadcasts it.
            return
        assert self.outstanding(gen) < self.max_outstanding, "pulled at max_outstanding"
        event_id, lane = gen.backlog.popleft()
        assert read is None or read == event_id, f"broadcast {read}, expected {event_id}"
        # The model: expire first, then the snapshot, then overflow.
        self.check_timeouts(gen)
        snapshot = {m.token for m in gen.members.values() if m.state == "active"}
        event = MEvent(event_id, lane, self.clock(), snapshot)
        if not snapshot:
            event.resolved_step = self.step
        gen.events[event_id] = event
        gen.order.append(event_id)
        gen.lanes.setdefault(lane, []).append(event_id)
        for msub in gen.members.values():
            if msub.token in snapshot:
                msub.queue.append(event_id)
        for msub in list(gen.members.values()):
            if msub.state == "active" and len(msub.queue) > self.queue_size:
                self.force_fail(msub, SubscriberOverflow)

    @precondition(
        lambda self: (
            self.gen is not None
            and self.gen.terminal is None
            and not self.gen.backlog
            and self.outstanding(self.gen) < self.max_outstanding
        )
    )
    @rule(fail=st.booleans())
    def upstream_ends(self, fail: bool) -> None:
        gen = self.gen
        assert gen is not None and gen.producer.opened
        if fail:
            gen.producer.fail(ConnectionError("upstream broke"))
        else:
            gen.producer.end()
        self.terminate(gen, StreamTerminated)
        self.settle()

    @rule(data=st.data())
    def pull(self, data: st.DataObject) -> None:
        candidates = self.pullable()
        if candidates:
            self.pull_one(data.draw(st.sampled_from(candidates)))

    def pull_one(self, msub: MSub) -> None:
        """A pull the model can answer at once: it hands out or raises."""
        gen = msub.gen
        expected: Any
        if msub.state == "left":
            expected = StopAsyncIteration
        else:
            self.check_timeouts(gen)
            self.close_window(msub)
            if msub.failure is not None:
                expected = msub.failure
            elif gen.terminal is not None:
                expected = gen.terminal
            else:
                expected = msub.queue.popleft()
                msub.current = expected
                msub.current_resolved = False
        try:
            got = self.run(anext(msub.sub))
        except (StopAsyncIteration, StreamTerminated, AckTimeout, SubscriberOverflow) as exc:
            assert isinstance(expected, type) and type(exc) is expected, (exc, expected)
        else:
            assert got == f"raw-{expected}", (got, expected)
        self.settle()

    def pullable(self) -> list[MSub]:
        """Subscribers whose pull the model answers at once: it hands out or raises."""
        return [
            m for m in self.subs if m.state != "active" or m.queue or m.gen.terminal is not None
        ]

    def queued(self) -> list[MSub]:
        return [m for m in self.subs if m.state == "active" and m.queue and not m.gen.terminal]

    @precondition(
        lambda self: (
            self.queued()
            or (self.gen is not None and self.gen.terminal is None and self.gen.members)
        )
    )
    @rule(data=st.data(), size=st.integers(1, 4), lane=st.integers(0, 3))
    def pull_batch(self, data: st.DataObject, size: int, lane: int) -> None:
        """A subscriber takes a batch of what is queued for it and holds it (or, now
        and then, one whose pull raises tries to). If nothing is queued for anyone,
        the producer first yields ``size`` events of ``lane``."""
        if not self.queued():
            self.producer_yields(lane, size)
        queued = self.queued()
        pool = queued if queued and data.draw(st.integers(0, 3)) else self.pullable()
        if pool:
            self.pull_batch_one(data.draw(st.sampled_from(pool)), size)

    def pull_batch_one(self, msub: MSub, size: int) -> int | None:
        """``pull_batch(size)`` the model can answer at once: it hands out up to
        ``size`` queued events under one number (held in ``msub.batches``), or raises."""
        gen = msub.gen
        expected: Any
        if msub.state == "left":
            expected = StopAsyncIteration
        else:
            self.check_timeouts(gen)
            self.close_window(msub)
            if msub.failure is not None:
                expected = msub.failure
            elif gen.terminal is not None:
                expected = gen.terminal
            else:
                taken = min(size, len(msub.queue))
                expected = [msub.queue.popleft() for _ in range(taken)]
        try:
            got = self.run(msub.sub.pull_batch(size))
        except (StopAsyncIteration, StreamTerminated, AckTimeout, SubscriberOverflow) as exc:
            assert isinstance(expected, type) and type(exc) is expected, (exc, expected)
            self.settle()
            return None
        assert isinstance(expected, list), (got, expected)
        assert got.events == [f"raw-{event_id}" for event_id in expected], (got, expected)
        assert got.seq not in self.binding_of and got.seq not in self.batch_seqs, got
        batch = msub.batches[got.seq] = self.batch_of[got.seq] = MBatch(got.seq, msub, expected)
        self.seqs.append(batch.seq)
        self.batch_seqs.append(batch.seq)
        self.settle()
        return batch.seq

    @precondition(lambda self: self.batch_of)
    @rule(
        data=st.data(),
        how=st.sampled_from(["confirm", "reject_bound", "fail_bound", *["reject_in_batch"] * 3]),
        reason=st.sampled_from(REASONS),
    )
    def batch_resolved(self, data: st.DataObject, how: str, reason: str | None) -> None:
        """A held batch's number (now and then a stale one: ignored) is confirmed,
        rejected, failed, or some of its events are rejected alone (``reject_in_batch``;
        indexes out of range are ignored, the other events stay bound to the number)."""
        assert self.manager is not None
        pool = list(self.batch_of) if data.draw(st.integers(0, 3)) else self.batch_seqs
        seq = data.draw(st.sampled_from(pool))
        if how == "confirm":
            self.confirm_seqs([seq])
            return
        if how != "reject_in_batch":
            self.resolve_batch(seq, "failed" if how == "fail_bound" else "rejected", reason)
            if how == "fail_bound":
                self.call(self.manager.fail_bound, [seq])
            else:
                self.call(self.manager.reject_bound, [seq], reason)
            self.settle()
            return
        batch = self.batch_of.get(seq)
        size = 4 if batch is None else len(batch.events)
        out_of_range = st.sampled_from([-1, size, 10**6])
        indexes = data.draw(st.lists(st.integers(0, size - 1) | out_of_range, max_size=3))
        if batch is not None:
            msub = batch.msub
            for index in indexes:
                if 0 <= index < len(batch.events) and batch.events[index] not in batch.apart:
                    event_id = batch.events[index]
                    batch.apart.add(event_id)
                    self.resolve(msub.gen, event_id, msub.token, "rejected", msub, reason)
            if not batch.remaining():  # nothing left to resolve: the number goes stale
                del self.batch_of[seq], msub.batches[seq]
        self.call(self.manager.reject_in_batch, seq, indexes, reason)
        self.settle()

    @rule(data=st.data())
    def bind(self, data: st.DataObject) -> None:
        if not self.subs:
            return
        msub = data.draw(st.sampled_from(self.subs))
        seq = self.call(msub.sub.bind)
        stopped = msub.gen.producer.closed > 0  # the open event was abandoned at the stop
        if msub.current is None or msub.current_resolved or msub.state == "left" or stopped:
            assert seq is None
            return
        assert isinstance(seq, int) and seq not in self.binding_of
        msub.bindings.setdefault(msub.current, set()).add(seq)
        self.binding_of[seq] = (msub, msub.current)
        self.seqs.append(seq)

    @rule(data=st.data(), garbage=st.lists(st.sampled_from([None, -1, 10**9, "7", 2.0])))
    def confirm(self, data: st.DataObject, garbage: list[Any]) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.seqs), max_size=4)) if self.seqs else []
        self.confirm_seqs(chosen, garbage)

    def confirm_seqs(self, chosen: list[Any], garbage: Sequence[Any] = ()) -> None:
        assert self.manager is not None
        for seq in chosen:
            if seq in self.batch_of:
                self.resolve_batch(seq, "acked")
                continue
            found = self.binding_of.pop(seq, None)
            if found is None:
                continue
            msub, event_id = found
            outstanding = msub.bindings[event_id]
            outstanding.discard(seq)
            if not outstanding and event_id in msub.closed_windows:
                msub.closed_windows.discard(event_id)
                del msub.bindings[event_id]
                self.resolve(msub.gen, event_id, msub.token, "acked")
        self.call(self.manager.confirm_persisted, [*chosen, *garbage])
        self.settle()

    @rule(data=st.data(), reason=st.sampled_from(REASONS))
    def reject(self, data: st.DataObject, reason: str | None) -> None:
        if not self.subs:
            return
        msub = data.draw(st.sampled_from(self.subs))
        # The model moves first: the real call lets the loop run the advances it causes.
        if msub.state != "left" and msub.current is not None and not msub.current_resolved:
            msub.current_resolved = True
            self.drop_bindings(msub, [msub.current])
            self.resolve(msub.gen, msub.current, msub.token, "rejected", msub, reason)
        self.call(msub.sub.reject, reason)
        self.settle()

    @rule(
        data=st.data(),
        fail=st.booleans(),
        reason=st.sampled_from(REASONS),
        garbage=st.lists(st.sampled_from([None, -1, 10**9, "7", 2.0])),
    )
    def resolve_bound(
        self, data: st.DataObject, fail: bool, reason: str | None, garbage: list[Any]
    ) -> None:
        """``reject_bound`` / ``fail_bound``: open window or closed, left or not."""
        assert self.manager is not None
        chosen = data.draw(st.lists(st.sampled_from(self.seqs), max_size=3)) if self.seqs else []
        how = "failed" if fail else "rejected"
        for seq in chosen:
            if seq in self.batch_of:
                self.resolve_batch(seq, how, reason)
                continue
            found = self.binding_of.get(seq)
            if found is None:
                continue  # stale: confirmed, or its event resolved already
            msub, event_id = found
            if msub.current == event_id:
                msub.current_resolved = True
            self.drop_bindings(msub, [event_id])  # its other numbers go stale
            self.resolve(msub.gen, event_id, msub.token, how, msub, reason)
        if fail:
            self.call(self.manager.fail_bound, [*chosen, *garbage])
        else:
            self.call(self.manager.reject_bound, [*chosen, *garbage], reason)
        self.settle()

    @rule(data=st.data(), crashed=st.booleans())
    def leave(self, data: st.DataObject, crashed: bool) -> None:
        live = self.live()
        if not live:
            return
        msub = data.draw(st.sampled_from(live))
        if list(msub.gen.members.values()) == [msub]:
            # The last leave opens the gate (``leave_model``): what it held runs first,
            # so the model does not move past a broadcast the real group makes then.
            self.gate.set()
            self.settle()
        self.leave_model(msub, crashed=crashed)

        async def leave() -> None:
            if crashed:
                try:
                    async with msub.sub:
                        raise RuntimeError("handler crashed")
                except RuntimeError:
                    pass
            else:
                await msub.sub.aclose()

        self.run(leave())
        self.settle()

    @rule(seconds=st.sampled_from([1.0, ACK_TIMEOUT / 2, ACK_TIMEOUT]))
    def clock_advances(self, seconds: float) -> None:
        self.clock.advance(seconds)
        # Each running group's timer expires what fell due, on the next loop turn.
        for gen in self.generations:
            if gen.terminal is None:
                self.expire(gen)
        self.settle()

    @precondition(lambda self: self.gen is not None and self.gen.terminal is None)
    @rule()
    def next_advance_raises(self) -> None:
        assert self.gen is not None
        self.gen.producer.advance_error = RuntimeError("commit refused")

    @rule(open_=st.booleans())
    def advance_gate(self, open_: bool) -> None:
        live_gens = [g for g in self.generations if g.members]
        if open_ or not live_gens:
            self.gate.set()
        else:
            self.gate.clear()
        self.settle()

    # -- liveness ------------------------------------------------------------------

    @precondition(lambda self: self.gen is not None and self.gen.terminal is None)
    @rule(
        lanes=st.lists(st.integers(0, 3), min_size=1, max_size=QUEUE_SIZE),
        slow_advances=st.booleans(),
        batching=st.booleans(),
    )
    def everyone_keeps_pulling(self, lanes: list[int], slow_advances: bool, batching: bool) -> None:
        """From here, every bound output is confirmed, the advance gate opens, and each
        active subscriber keeps pulling: the stream must move.

        First what is already there is handed out and advanced (a subscriber may
        still overflow on a burst the poll pulls as advances make room: it is
        force-failed, as documented). Then the producer yields new events, one per
        ``lanes``, and each must be handed to every active subscriber and advanced as
        acked by each; with ``slow_advances``, each subscriber first pulls all of
        them while advances wait at the gate, so events resolve while their lane's
        advance is in flight. With ``batching``, subscribers take what is queued with
        ``pull_batch`` and confirm each batch at once. Each time within a bounded
        number of turns (``drive``). Or an advance raised (``next_advance_raises``)
        and the group ended with ``AdvanceFailed``.
        """
        gen = self.gen
        assert gen is not None
        self.confirm_seqs([*self.binding_of, *self.batch_of])
        self.advance_gate(open_=True)
        if not self.drive(gen, "what was there before", batching):
            return
        new = list(range(self.next_event, self.next_event + len(lanes)))
        for lane in lanes:  # no more than a queue holds: nobody overflows
            if self.ended_by_advance(gen):  # an event broadcast to nobody was advanced
                return
            self.producer_yields(lane)
        if slow_advances:
            self.advance_gate(open_=False)
            for msub in self.active_members(gen):
                while msub.queue and gen.terminal is None:
                    self.take(msub, batching)
            self.advance_gate(open_=True)
        if not self.drive(gen, f"new events {new}", batching):
            return
        for event_id in new:
            event = gen.events[event_id]
            assert set(event.resolved.values()) <= {"acked"}, f"a new event: {event}"

    def take(self, msub: MSub, batching: bool) -> None:
        """Pull what is queued for ``msub``: one event, or a batch confirmed at once."""
        if not batching:
            self.pull_one(msub)
            return
        seq = self.pull_batch_one(msub, self.queue_size)
        if seq is not None:
            self.confirm_seqs([seq])

    def drive(self, gen: Generation, what: str, batching: bool = False) -> bool:
        """Each active subscriber pulls, turn after turn, until ``gen`` is quiescent:
        nothing left at the producer, every event broadcast advanced. Returns False
        if the group ended instead (an advance raised)."""
        # Per event: a turn to hand it out and one to close the windows on it (which
        # may let the poll broadcast the next). Then what is queued already.
        turns = 2 * len(gen.backlog) + self.queue_size + 2
        for _ in range(turns):
            if gen.terminal is not None or self.quiescent(gen):
                break
            for msub in self.active_members(gen):
                if msub.queue:
                    self.take(msub, batching)
                elif msub.current is not None:
                    self.pull_at_the_head(msub)
        if self.ended_by_advance(gen):
            return False
        assert self.quiescent(gen), self.stall(gen, what, turns)
        return True

    @staticmethod
    def active_members(gen: Generation) -> list[MSub]:
        """The members that pull; a force-failed one owes nothing, is in no snapshot."""
        return [msub for msub in gen.members.values() if msub.state == "active"]

    def ended_by_advance(self, gen: Generation) -> bool:
        """Whether ``gen`` ended, which must be because an advance raised: nothing else
        (leaving, the upstream ending) happens while everyone keeps pulling."""
        if gen.terminal is None:
            return False
        assert gen.terminal is AdvanceFailed and gen.advance_failed, gen.terminal
        return True

    def pull_at_the_head(self, msub: MSub) -> None:
        """A pull with nothing queued: it closes the window and waits, and is cancelled
        unless an event it may take is broadcast meanwhile."""
        self.check_timeouts(msub.gen)
        self.close_window(msub)
        pulled = asyncio.ensure_future(anext(msub.sub), loop=self.loop)
        self.settle()
        if not pulled.done():
            pulled.cancel()  # cancelled while waiting: hands out nothing
            self.settle()
            return
        error = pulled.exception()
        if error is not None:  # the group ended, or a burst overflowed it, meanwhile
            expected_error = msub.failure or msub.gen.terminal
            assert type(error) is expected_error, (error, expected_error)
            return
        assert msub.queue, f"{msub.token}: a pull with nothing queued returned {pulled!r}"
        expected = msub.queue.popleft()
        msub.current = expected
        msub.current_resolved = False
        assert pulled.result() == f"raw-{expected}", (pulled, expected)

    def quiescent(self, gen: Generation) -> bool:
        return not gen.backlog and all(event.advanced for event in gen.events.values())

    def stall(self, gen: Generation, what: str, turns: int) -> str:
        stuck = []
        if gen.backlog:
            stuck.append(f"the poll never broadcast events {[e for e, _ in gen.backlog]}")
        unadvanced = [e for e in gen.events.values() if not e.advanced]
        if unadvanced:
            stuck.append(f"{len(unadvanced)} broadcast events were never advanced: {unadvanced}")
        members = {m.token: (m.state, m.current, list(m.queue)) for m in gen.members.values()}
        return (
            f"no progress after {turns} turns of every active subscriber pulling ({what}): "
            + "; ".join(stuck)
            + f". Members (state, on, queued): {members}"
        )

    @invariant()
    def the_producer_saw_no_violation(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def stats_agree_with_the_model(self) -> None:
        self.step += 1
        if self.manager is None or self.gen is None or self.gen.terminal is not None:
            return
        if self.gen.backlog:
            # A poll on its way to the limit (each event of a run it takes back after an
            # advance costs a few loop turns) is progress, not a stall: let it get there.
            # A poll that never does fails ``run``'s timeout.
            self.run(self.taken(self.gen))
            if self.gen.terminal is not None:
                return
        stats = {s.key: s for s in self.manager.stats()}
        if "key" not in stats:
            return
        active = sum(1 for m in self.gen.members.values() if m.state == "active")
        failed = sum(1 for m in self.gen.members.values() if m.state == "failed")
        assert (stats["key"].subscribers, stats["key"].failed_subscribers) == (active, failed)
        advanced = sum(1 for e in self.gen.events.values() if e.advanced)
        assert stats["key"].advanced_events == advanced
        assert stats["key"].outstanding == len(self.gen.events) - advanced
        assert stats["key"].outstanding <= self.max_outstanding
        if self.gen.backlog:  # progress: held back only at the limit
            assert stats["key"].outstanding == self.max_outstanding, stats["key"]


GroupMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    report_multiple_bugs=False,
    database=None,
)
test_random_interleavings = GroupMachine.TestCase
