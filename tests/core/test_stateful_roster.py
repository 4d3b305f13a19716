"""Random interleavings on a rostered group whose broker redelivers
(docs/concepts.md#snapshot-and-roster, docs/concepts.md#redelivery-memory).

The main user's one non-negotiable, checked after every step: the broker never
moves past an event unless every declared handler acked or rejected it. Concretely:

* every advanced event's snapshot is the whole roster
  (``acked + failed + rejected == len(ROSTER)``), so an event no member failed was
  acked or rejected by each of them;
* a subscriber is counted ``acked`` for a copy only if it was handed that copy, or
  acked an earlier copy of the same event id in this group (the redelivery memory): the
  ``acked`` count never exceeds the members that were handed the copy or an earlier
  copy they did not reject or crash on;
* a member is never handed a copy of an event id it certainly acked in this group
  (a window closed with every output bound to it confirmed, a batch confirmed):
  The redelivery memory checks at the broadcast and again at the hand-out, on every path;
* a paused group broadcasts nothing: while a member is missing or force-failed,
  the number of broadcast events does not grow;
* ``GroupStats.missing`` names at least every member that is not attached.

Both bulk paths run through all of it: members may take batches (``pull_batch``)
and hold them, to be confirmed, rejected, failed or partly rejected
(``reject_in_batch``) later, and a run's broker (drawn once) delivers single copies
or ``EventBatch`` es of one lane with their event ids (``open_stream_batches``).

And *liveness*, from whatever state a rule reaches (``everyone_keeps_pulling``): once every member
is attached and healthy and all of them keep pulling (and confirm what they bound), the group makes
progress within a bounded number of pulls: the poll broadcasts every copy the broker delivers, each
member is handed the new events, and every event broadcast before is advanced. It is driven twice,
the second time with redelivered copies every member acked (the redelivery memory: handed to
nobody), the case where a poll waiting for room was once never woken; some members may take what is
queued in batches, confirmed at once.

``ACKGATE_HYPOTHESIS_EXAMPLES`` sets the number of examples (default 2000; this
machine runs a quarter of them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Collection, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ackgate import (
    AckGateError,
    AdvanceItem,
    BoundBatch,
    EventBatch,
    SharedStreamManager,
    Subscription,
)
from ackgate.testing import FakeClock, ScriptedProducer

EXAMPLES = max(1, int(os.environ.get("ACKGATE_HYPOTHESIS_EXAMPLES", "2000")) // 4)
ROSTER = ("indexer", "auditor", "notifier")
ACK_TIMEOUT = 100.0
IDS = 4  # event ids are drawn from a small pool, so copies (redeliveries) are common
#: Queue sizes a run draws: with 2 the poll waits for room often and the batch poll
#: broadcasts one event per run, with 8 two.
QUEUE_SIZES = (2, 8)
#: The most copies the broker delivers at once (``broker_delivers_batch``).
BATCH_MAX = 3


@dataclass
class HeldBatch:
    """A ``BoundBatch`` a member holds: the copies it was handed under one number."""

    name: str
    copies: list[tuple[int, int]]
    #: Indexes rejected alone (``reject_in_batch``): confirming the number skips them.
    apart: set[int] = field(default_factory=set)


class RedeliveringProducer(ScriptedProducer):
    """Payload ``(event_id, copy)``; every advance is checked by the machine."""

    def __init__(self, machine: RosterMachine) -> None:
        super().__init__(lane=lambda payload: payload[0] % 2)
        self.machine = machine
        #: Copies the stream yielded to a poll: the rest still waits at the "broker".
        self.yielded = 0

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        async for item in super().open_stream():
            self.yielded += 1
            yield item

    def get_event_id(self, broker_payload: Any) -> Hashable | None:
        return broker_payload[0]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        # Recorded, not raised: an exception here would only end the group.
        self.machine.violations.extend(self.machine.check_advance(batch))
        await super().advance(batch)


class BatchingProducer(RedeliveringProducer):
    """Read through ``open_stream_batches``: the broker delivers ``EventBatch`` es of
    one lane, with their event ids."""

    async def open_stream_batches(self) -> AsyncIterator[EventBatch]:
        async for batch in ScriptedProducer.open_stream(self):
            self.yielded += len(batch.raw_events)
            yield batch


class RosterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.manager: SharedStreamManager | None = None
        self.producer = RedeliveringProducer(self)
        self.subs: dict[str, Subscription] = {}
        #: Per member: the copy it is on, ``(event_id, copy)``.
        self.on: dict[str, tuple[int, int] | None] = {}
        #: (event_id, copy) -> members that moved past it or left cleanly while on it,
        #: without rejecting it: the only ones that may have acked it.
        self.closed_cleanly: dict[tuple[int, int], set[str]] = {}
        #: (member, copy) pairs the member rejected.
        self.rejected: set[tuple[str, tuple[int, int]]] = set()
        self.copies = 0
        #: Event ids never delivered before: ``IDS``, ``IDS + 1``, ...
        self.fresh_ids = IDS
        #: Per member: every copy it was handed, whatever its subscription.
        self.handed: dict[str, set[tuple[int, int]]] = {name: set() for name in ROSTER}
        self.seqs: list[int] = []
        #: Batches members hold (``pull_batch``), by number, until resolved here.
        self.held: dict[int, HeldBatch] = {}
        self.queue_size = QUEUE_SIZES[0]
        self.paused_broadcasts: int | None = None
        #: Members whose last pull raised (force-failed): a supervisor re-subscribes them.
        self.failed: set[str] = set()
        # What each member certainly acked (the redelivery memory: it is never handed a copy of it
        # again). Kept only while exact: an ack timeout (``clock_advances``) may force-fail a member
        # or a departed subscription, which fails what they owe, so every ack still in the making is
        # forgotten then (what is recorded stays: acks stand).
        #: Per member: event ids it certainly acked in this group.
        self.acked: dict[str, set[int]] = {name: set() for name in ROSTER}
        #: Per member: the single copy it is on, whose window closing acks it once
        #: every output bound to it is confirmed.
        self.window_ack: dict[str, tuple[int, int]] = {}
        #: Outputs bound to single copies, by number: ``(member, copy)``.
        self.bound: dict[int, tuple[str, tuple[int, int]]] = {}
        #: ``(member, copy)`` -> numbers bound to it not confirmed yet.
        self.unconfirmed: dict[tuple[str, tuple[int, int]], set[int]] = {}
        #: ``(member, copy)`` whose window closed: acked once ``unconfirmed`` empties.
        self.awaiting: set[tuple[str, tuple[int, int]]] = set()
        #: Held batch numbers whose confirmation acks their copies (not rejected apart).
        self.batch_ackable: set[int] = set()
        self.violations: list[str] = []

    # -- plumbing ------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 5))

    def settle(self) -> None:
        async def turns() -> None:
            for _ in range(40):
                await asyncio.sleep(0)

        self.run(turns())

    def teardown(self) -> None:
        try:
            if self.manager is not None:
                self.run(self.manager.aclose())
        finally:
            self.loop.close()

    def close_window(self, name: str) -> None:
        current = self.on.get(name)
        if current is not None and (name, current) not in self.rejected:
            self.closed_cleanly.setdefault(current, set()).add(name)
        self.on[name] = None
        copy = self.window_ack.pop(name, None)
        if copy is not None:
            if self.unconfirmed.get((name, copy)):
                self.awaiting.add((name, copy))
            else:
                self.acked[name].add(copy[0])

    def drop_window(self, name: str) -> None:
        """The copy ``name`` is on is resolved otherwise (rejected, crashed on): its
        outputs no longer count."""
        copy = self.window_ack.pop(name, None)
        for seq in self.unconfirmed.pop((name, copy), set()) if copy is not None else ():
            del self.bound[seq]

    def forget_acks_in_the_making(self) -> None:
        self.window_ack.clear()
        self.bound.clear()
        self.unconfirmed.clear()
        self.awaiting.clear()
        self.batch_ackable.clear()

    def check_hand_out(self, name: str, copies: Sequence[tuple[int, int]]) -> None:
        acked = self.acked[name]
        again = [copy for copy in copies if copy[0] in acked]
        assert not again, f"redelivery memory: {name} was handed {again}, copies of ids it acked"

    # -- checks --------------------------------------------------------------------

    def check_advance(self, batch: Sequence[AdvanceItem]) -> list[str]:
        violations = []
        for item in batch:
            outcome = item.outcome
            if outcome.acked + outcome.failed + outcome.rejected != len(ROSTER):
                violations.append(f"{item.broker_payload}: snapshot is not the roster {outcome}")
            copy = item.broker_payload
            event_id, number = copy
            # Copies are broadcast in the order they were fed, so only a member
            # handed an earlier copy can have acked one before this copy came.
            earlier = set().union(
                *(
                    names
                    for (other_id, other_number), names in self.closed_cleanly.items()
                    if other_id == event_id and other_number < number
                )
            )
            bound = earlier | self.closed_cleanly.get(copy, set())
            if outcome.acked > len(bound):
                violations.append(f"{copy}: {outcome} but only {sorted(bound)} may have acked")
        return violations

    def broadcasts(self) -> int | None:
        assert self.manager is not None
        stats = self.manager.stats()
        if not stats:
            return None
        return stats[0].outstanding + stats[0].advanced_events

    # -- rules ---------------------------------------------------------------------

    @initialize(batched=st.booleans(), queue_size=st.sampled_from(QUEUE_SIZES))
    def start(self, batched: bool, queue_size: int) -> None:
        """The broker delivers single copies or, ``batched``, ``EventBatch`` es."""
        self.queue_size = queue_size
        if batched:
            self.producer = BatchingProducer(self)

        async def make() -> SharedStreamManager:
            return SharedStreamManager(
                ack_timeout=ACK_TIMEOUT, subscriber_queue_size=queue_size, clock=self.clock
            )

        self.manager = self.run(make())
        for name in ROSTER:  # a service starts with all its handlers
            self.subscribe(name)

    @rule(name=st.sampled_from(ROSTER))
    def subscribe(self, name: str) -> None:
        if name in self.subs:
            return
        manager, producer = self.manager, self.producer
        assert manager is not None

        async def subscribe() -> Subscription:
            return manager.subscribe("key", name, producer=lambda: producer, roster=ROSTER)

        self.subs[name] = self.run(subscribe())
        self.on[name] = None
        self.settle()

    @rule(event_id=st.integers(0, IDS - 1))
    def broker_delivers(self, event_id: int) -> None:
        self.deliver(event_id)

    @rule(event_ids=st.lists(st.integers(0, IDS - 1), min_size=1, max_size=BATCH_MAX))
    def broker_delivers_batch(self, event_ids: list[int]) -> None:
        """Copies of one lane delivered at once (one ``EventBatch`` if batched)."""
        lane = event_ids[0] % 2
        self.deliver_batch([event_id for event_id in event_ids if event_id % 2 == lane])

    def deliver(self, event_id: int) -> tuple[int, int]:
        [copy] = self.deliver_batch([event_id])
        return copy

    def deliver_batch(self, event_ids: list[int]) -> list[tuple[int, int]]:
        """Deliver a copy of each of ``event_ids`` (all of one lane), in order."""
        copies = []
        for event_id in event_ids:
            self.copies += 1
            copies.append((event_id, self.copies))
        if isinstance(self.producer, BatchingProducer):
            lane = event_ids[0] % 2
            self.producer.feed_item(EventBatch(copies, copies, lane, event_ids))
        else:
            for copy in copies:
                self.producer.feed(copy, copy)
        self.settle()
        return copies

    @rule(name=st.sampled_from(ROSTER))
    def pull(self, name: str) -> None:
        self.take(name, None)

    @rule(
        name=st.sampled_from(ROSTER),
        size=st.integers(1, 4),
        delivered=st.lists(st.integers(0, IDS - 1), max_size=BATCH_MAX),
    )
    def pull_batch(self, name: str, size: int, delivered: list[int]) -> None:
        """The member takes a batch of what is queued for it and holds it; first the
        broker delivers copies of ``delivered`` (of one lane), if any."""
        if delivered:
            self.broker_delivers_batch(delivered)
        self.take(name, size)

    def take(self, name: str, size: int | None) -> int | None:
        """A pull (``size`` None) or a ``pull_batch(size)``, cancelled if it waits.
        Returns the number of the batch taken, if one was."""
        sub = self.subs.get(name)
        if sub is None:
            return None
        self.close_window(name)  # before the pull: the advance it causes is checked at once
        pulled = asyncio.ensure_future(
            anext(sub) if size is None else sub.pull_batch(size), loop=self.loop
        )
        self.settle()
        if not pulled.done():
            pulled.cancel()
            self.settle()
            return None
        try:
            result = pulled.result()
        except (AckGateError, StopAsyncIteration, asyncio.CancelledError):
            self.on[name] = None
            self.failed.add(name)
            return None
        if not isinstance(result, BoundBatch):
            self.check_hand_out(name, [result])
            self.on[name] = result
            self.window_ack[name] = result
            self.handed[name].add(result)
            return None
        assert 1 <= len(result.events) <= size, result  # its windows closed at once
        self.check_hand_out(name, result.events)
        self.handed[name].update(result.events)
        self.held[result.seq] = HeldBatch(name, list(result.events))
        self.batch_ackable.add(result.seq)
        self.seqs.append(result.seq)
        return result.seq

    def confirmed(self, seqs: Sequence[int]) -> None:
        """The model's part of ``confirm_persisted``: a held batch's member may have
        acked every copy of it not rejected alone (and did, unless an ack timeout may
        have force-failed it since it took the batch); a single copy's member acked
        it if this was its last output and its window is closed."""
        for seq in seqs:
            held = self.held.pop(seq, None)
            if held is not None:
                certain = seq in self.batch_ackable
                self.batch_ackable.discard(seq)
                for index, copy in enumerate(held.copies):
                    if index not in held.apart:
                        self.closed_cleanly.setdefault(copy, set()).add(held.name)
                        if certain:
                            self.acked[held.name].add(copy[0])
            found = self.bound.pop(seq, None)
            if found is not None:
                pending = self.unconfirmed[found]
                pending.discard(seq)
                if not pending:
                    del self.unconfirmed[found]
                    if found in self.awaiting:
                        self.awaiting.discard(found)
                        self.acked[found[0]].add(found[1][0])

    @precondition(lambda self: self.held)
    @rule(
        data=st.data(),
        how=st.sampled_from(["confirm", "reject_bound", "fail_bound", *["reject_in_batch"] * 3]),
    )
    def batch_resolved(self, data: st.DataObject, how: str) -> None:
        """A held batch is confirmed, rejected, failed, or some of its copies are
        rejected alone (``reject_in_batch``; indexes out of range are ignored)."""
        manager = self.manager
        assert manager is not None
        seq = data.draw(st.sampled_from(sorted(self.held)))
        held = self.held[seq]
        size = len(held.copies)
        out_of_range = st.sampled_from([-1, size, 10**6])
        indexes = data.draw(st.lists(st.integers(0, size - 1) | out_of_range, max_size=3))

        async def resolve() -> None:
            if how == "confirm":
                manager.confirm_persisted([seq])
            elif how == "reject_bound":
                manager.reject_bound([seq], "no")
            elif how == "fail_bound":
                manager.fail_bound([seq])
            else:
                manager.reject_in_batch(seq, indexes, "bad copy")

        if how == "confirm":
            self.confirmed([seq])
        elif how == "reject_in_batch":
            held.apart.update(index for index in indexes if 0 <= index < size)
            if len(held.apart) == size:
                del self.held[seq]
                self.batch_ackable.discard(seq)
        else:
            del self.held[seq]
            self.batch_ackable.discard(seq)
        self.run(resolve())
        self.settle()

    @rule()
    def supervisor_resubscribes_the_failed(self) -> None:
        for name in sorted(self.failed):
            self.leave(name, crashed=False)
            self.subscribe(name)
        self.failed.clear()

    @rule()
    def everyone_pulls(self) -> None:
        for name in ROSTER:
            self.pull(name)

    @rule(name=st.sampled_from(ROSTER))
    def bind(self, name: str) -> None:
        sub = self.subs.get(name)
        if sub is None:
            return

        async def bind() -> int | None:
            return sub.bind()

        seq = self.run(bind())
        if seq is not None:
            self.seqs.append(seq)
            copy = self.window_ack.get(name)
            if copy is not None:
                self.bound[seq] = (name, copy)
                self.unconfirmed.setdefault((name, copy), set()).add(seq)

    @rule(data=st.data())
    def confirm(self, data: st.DataObject) -> None:
        if not self.seqs or self.manager is None:
            return
        seq = data.draw(st.sampled_from(self.seqs))
        manager = self.manager
        self.confirmed([seq])

        async def confirm() -> None:
            manager.confirm_persisted([seq])

        self.run(confirm())
        self.settle()

    @rule(name=st.sampled_from(ROSTER))
    def reject(self, name: str) -> None:
        sub = self.subs.get(name)
        if sub is None:
            return

        async def reject() -> None:
            sub.reject()

        current = self.on.get(name)
        if current is not None and name not in self.closed_cleanly.get(current, set()):
            self.rejected.add((name, current))
        self.drop_window(name)

        self.run(reject())
        self.settle()

    @rule(name=st.sampled_from(ROSTER), crashed=st.booleans())
    def leave(self, name: str, crashed: bool) -> None:
        sub = self.subs.pop(name, None)
        if sub is None:
            return
        if crashed:
            self.drop_window(name)
        else:
            self.close_window(name)

        async def leave() -> None:
            if crashed:
                try:
                    async with sub:
                        raise RuntimeError("handler crashed")
                except RuntimeError:
                    pass
            else:
                await sub.aclose()

        self.run(leave())
        self.on.pop(name, None)
        if not self.subs:  # the group stopped; the next subscribe starts a new one
            self.paused_broadcasts = None
            self.forget_acks_in_the_making()  # its outputs can never count any more
            for acked in self.acked.values():
                acked.clear()  # a new group remembers nothing
        self.settle()

    @rule(seconds=st.sampled_from([1.0] * 9 + [ACK_TIMEOUT]))
    def clock_advances(self, seconds: float) -> None:
        """Only a step of ``ACK_TIMEOUT`` can make anything fall due (the small steps
        of a run add up to less)."""
        if seconds >= ACK_TIMEOUT:
            self.forget_acks_in_the_making()
        self.clock.advance(seconds)
        self.settle()

    # -- liveness ------------------------------------------------------------------

    @rule(
        redelivered=st.lists(st.integers(0, IDS - 1), max_size=3),
        batchers=st.sets(st.sampled_from(ROSTER)),
    )
    def everyone_keeps_pulling(self, redelivered: list[int], batchers: set[str]) -> None:
        """From here, with every member attached, healthy and pulling, the stream moves.

        First the broker delivers ``redelivered`` copies and one new event; then two
        copies of that event (every member acked it, so both are handed to nobody
        and fill the queues) and another new one, which a poll waiting for room must
        still broadcast. Each time the group must be quiescent within a bounded
        number of pulls (``drive``), every copy delivered must be advanced as acked
        by the whole roster, and each member handed the new event. The ``batchers``
        take what is queued for them with ``pull_batch`` and confirm each batch at
        once; a batched broker delivers the two copies in one ``EventBatch``.
        """
        self.attach_everyone()
        assert self.manager is not None
        self.run(self.confirm_all(self.manager))
        fresh = self.fresh_id()
        first = [self.deliver(event_id) for event_id in redelivered]
        new = self.deliver(fresh)
        self.drive([*first, new], f"copies {first} and a new event", batchers)
        again = self.deliver_batch([fresh, fresh])
        newer = self.deliver(self.fresh_id())
        what = f"redelivered copies {again} that every member acked"
        self.drive([*again, newer], what, batchers)
        handed = {name: sorted(self.handed[name] & set(again)) for name in ROSTER}
        assert not any(handed.values()), f"redelivery memory: acked copies handed again: {handed}"

    def fresh_id(self) -> int:
        self.fresh_ids += 1
        return self.fresh_ids - 1

    def attach_everyone(self) -> None:
        """A supervisor's part: re-subscribe the members that failed, and the missing."""
        self.supervisor_resubscribes_the_failed()
        for name in ROSTER:
            self.subscribe(name)

    async def confirm_one(self, manager: SharedStreamManager, seq: int) -> None:
        manager.confirm_persisted([seq])

    async def confirm_all(self, manager: SharedStreamManager) -> None:
        self.confirmed(self.seqs)
        manager.confirm_persisted(self.seqs)  # stale numbers are ignored

    def drive(
        self, delivered: list[tuple[int, int]], what: str, batchers: Collection[str] = ()
    ) -> None:
        """Every member pulls, turn after turn, until the group is quiescent.

        Quiescent: the producer waits for the broker (every copy delivered was
        broadcast), nothing broadcast is unadvanced, and the group is not paused.
        A turn is one pull per member, each followed by a few dozen loop turns
        (``settle``). Allowed: a turn per copy still at the producer or just
        delivered, and spare turns for what the members held or had queued, and for
        a batch the poll took and holds.
        """
        spare = 2 * self.queue_size + 4 + BATCH_MAX
        turns = self.copies - self.producer.yielded + len(delivered) + spare
        manager = self.manager
        assert manager is not None
        for _ in range(turns):
            self.attach_everyone()
            for name in ROSTER:
                if name not in batchers:
                    self.pull(name)
                    continue
                seq = self.take(name, self.queue_size)
                if seq is not None:
                    self.confirmed([seq])
                    self.run(self.confirm_one(manager, seq))
            if self.quiescent():
                break
        else:
            raise AssertionError(self.stall(turns, delivered, what))
        outcomes = {
            item.broker_payload: item.outcome
            for batch in self.producer.batches
            for item in batch
            if item.broker_payload in delivered
        }
        for copy in delivered:
            outcome = outcomes.get(copy)
            assert outcome is not None and outcome.acked == len(ROSTER), (
                f"{what}: {copy} advanced as {outcome}, not acked by the whole roster"
            )
        new = delivered[-1]
        missed = [name for name in ROSTER if new not in self.handed[name]]
        assert not missed, f"{what}: the new event {new} was never handed to {missed}"

    def quiescent(self) -> bool:
        assert self.manager is not None
        stats = self.manager.stats()
        return (
            self.producer.starved.is_set()
            and len(stats) == 1
            and not stats[0].paused
            and stats[0].outstanding == 0
        )

    def stall(self, turns: int, delivered: list[tuple[int, int]], what: str) -> str:
        assert self.manager is not None
        stats = self.manager.stats()
        group = stats[0] if stats else None
        stuck = []
        if not self.producer.starved.is_set():
            untaken = self.copies - self.producer.yielded
            stuck.append(
                f"the poll never took {untaken} delivered copies from the producer"
                if untaken
                else "the poll holds the last copy it took and never broadcast it"
            )
        if group is None:
            stuck.append("no group is running")
        else:
            if group.paused:
                stuck.append(f"the group stayed paused (missing {group.missing})")
            if group.outstanding:
                stuck.append(f"{group.outstanding} broadcast events were never advanced")
        new = delivered[-1]
        missed = [name for name in ROSTER if new not in self.handed[name]]
        if missed:
            stuck.append(f"the new event {new} was never handed to {missed}")
        return (
            f"no progress after {turns} turns of every member pulling ({what}): "
            + "; ".join(stuck)
            + f". Delivered {delivered}; {group}"
        )

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def every_advance_was_earned(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def a_paused_group_broadcasts_nothing(self) -> None:
        if self.manager is None:
            return
        stats = self.manager.stats()
        if not stats:
            self.paused_broadcasts = None
            return
        (group,) = stats
        assert set(ROSTER) - set(self.subs) <= set(group.missing)
        assert group.paused == bool(group.missing)
        broadcast = group.outstanding + group.advanced_events
        if group.paused:
            if self.paused_broadcasts is not None:
                assert broadcast == self.paused_broadcasts, "a paused group broadcast"
            self.paused_broadcasts = broadcast
        else:
            self.paused_broadcasts = None


RosterMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    report_multiple_bugs=False,
    database=None,
)
test_rostered_random_interleavings = RosterMachine.TestCase
