"""How a handler's calls resolve their tickets: acks, rejects, giving up
(``give_up_after``) and failures, which are handed again after the redelivery backoff
(:class:`Resolutions`, the half of :class:`~ackgate._service.calls.Calls` that decides
outcomes; the other half feeds and runs the jobs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ackgate._contract.message import Reject
from ackgate._service.handlers import HandlerCounters, HandlerSpec
from ackgate._service.jobs import Job, describe, unresolved_reason
from ackgate._service.retry import Redelivery
from ackgate._service.unresolved import UnresolvedCalls

if TYPE_CHECKING:
    from ackgate._core.manager import SharedStreamManager

logger = logging.getLogger("ackgate.service")


class Resolutions:
    """The outcome side of a handler's calls; its state is set by ``Calls``."""

    _spec: HandlerSpec
    _manager: SharedStreamManager
    _counters: HandlerCounters
    _unresolved: UnresolvedCalls
    _redelivery: Redelivery
    _clock: Callable[[], float]
    _ack_timeout: float
    #: ``Calls._park``: hand the job to the handler again in that many seconds.
    _park: Callable[[Job, float], None]

    def _result(self, result: object) -> dict[str, Reject] | None:
        """What a call returned: ``None`` acks, a ``Reject`` is raised, a batch
        handler's ``{message id: Reject}`` is returned; anything else is a
        ``TypeError`` naming the handler, logged at ERROR the first time."""
        if result is None:
            return None
        if isinstance(result, Reject):
            raise result
        spec = self._spec
        if spec.batched:
            if isinstance(result, dict) and all(isinstance(v, Reject) for v in result.values()):
                return result
            expected = (
                "None (ack all) or a dict of message id -> Reject (reject those, ack the rest)"
            )
        else:
            expected = "None (ack) or a Reject (reject)"
        error = TypeError(
            f"handler {spec.id!r} returned {type(result).__name__}; it must return {expected}"
        )
        if not self._counters.bad_return_logged:
            self._counters.bad_return_logged = True
            logger.error(
                "%s. Each call that returns anything else fails (retried per its retry, "
                "then the broker redelivers the message); logged once per handler",
                error,
            )
        raise error

    def _cut_short(self, job: Job) -> None:
        """A call on ``job`` ended without resolving it: count the hand-out for the
        messages' next deliveries (``Message.attempt``, ``give_up_after``)."""
        self._count_unresolved(job)

    def _count_unresolved(self, job: Job) -> None:
        apart = job.apart
        handler_id = self._spec.id
        ended = self._unresolved.ended_unresolved
        for index, message in enumerate(job.messages):
            if apart is None or index not in apart:
                ended(handler_id, message)

    def _give_up_unresolved(self, job: Job, limit: int) -> bool:
        """Reject, without a call, the messages of ``job`` this handler was handed
        ``limit`` times already without resolving them (see
        :mod:`ackgate._service.unresolved`: deliveries before this process saw the
        message, when the process stopped during each, say, as when handling it kills
        it; and the hand-outs cut short since), so a call would most likely end the same
        way. Returns whether nothing is left to call; otherwise a batch job is left
        with the others only."""
        shown = job.shown
        apart = job.apart
        handler_id = self._spec.id
        stale = {
            index: message.attempt - 1
            for index, message in enumerate(shown)
            if message.attempt is not None
            and message.attempt > limit
            and (apart is None or index not in apart)
        }
        if not stale:
            return False
        for index, unresolved in stale.items():
            logger.warning(
                "handler %r gives up on message id=%s (attempt %s, give_up_after=%d) "
                "without calling it: %d earlier deliveries were never resolved by it (did "
                "the process stop while handling it?); it is dead-lettered once every "
                "handler is done with it",
                handler_id,
                shown[index].id,
                shown[index].attempt,
                limit,
                unresolved,
            )
        self._counters.gave_up += len(stale)
        reasons = {index: unresolved_reason(unresolved) for index, unresolved in stale.items()}
        if not self._spec.batched:
            job.resolved = True
            self._manager.reject_bound(job.seqs, reason=reasons[0])
            return True
        self._reject_each(job, reasons)
        job.apart = (apart or set()) | set(stale)
        if len(job.apart) == len(shown):
            job.resolved = True
            # Acks what was set apart without a reject (a replay meant for another
            # handler, feed.handed_out); the rejects stay so.
            self._manager.confirm_persisted(job.seqs)
            return True
        job.argument = [m for index, m in enumerate(shown) if index not in job.apart]
        return False

    def _failed(self, job: Job, exc: BaseException, calls: int) -> None:
        """``job`` failed every call: this handler gives up on its messages at
        ``attempt >= give_up_after`` (a reject, with the exception as the reason); the
        rest are handed to it again after the redelivery backoff (or, past half the ack
        timeout, failed: the broker redelivers them)."""
        spec = self._spec
        counters = self._counters
        limit = spec.give_up_after
        apart = job.apart
        called = [
            (index, message)
            for index, message in enumerate(job.shown)
            if apart is None or index not in apart
        ]
        given: dict[int, str | None] = {}
        if limit is not None:
            given = {
                index: f"gave up after {message.attempt} attempts: {type(exc).__name__}: {exc}"
                for index, message in called
                if message.attempt is not None and message.attempt >= limit
            }
        if given:
            counters.gave_up += len(given)
            if not spec.batched:
                job.resolved = True
                self._manager.reject_bound(job.seqs, reason=given[0])
                logger.warning(
                    "handler %r gave up on %s (give_up_after=%s) after %d call(s); it is "
                    "dead-lettered once every handler is done with it: %r",
                    spec.id,
                    describe(job),
                    limit,
                    calls,
                    exc,
                    exc_info=exc if job.failures == 0 else None,
                )
                return
            self._reject_each(job, given)
            job.apart = (apart or set()) | set(given)
            if len(given) == len(called):
                job.resolved = True
                logger.warning(
                    "handler %r gave up on %s (give_up_after=%s) after %d call(s); they are "
                    "dead-lettered once every handler is done with them: %r",
                    spec.id,
                    describe(job),
                    limit,
                    calls,
                    exc,
                    exc_info=exc if job.failures == 0 else None,
                )
                return
        failing = len(called) - len(given)
        counters.failed += failing
        self._count_unresolved(job)
        first = job.failures == 0
        job.failures += 1
        attempts = [m.attempt for i, m in called if i not in given and m.attempt is not None]
        delay = self._redelivery.delay(max(attempts, default=job.failures))
        gave_up = (
            f" (gave up on {len(given)} of them at give_up_after={limit}: ids "
            f"{', '.join(job.shown[index].id for index in list(given)[:5])})"
            if given
            else ""
        )
        if self._clock() + delay - job.handed_at > self._ack_timeout / 2:
            job.resolved = True
            self._manager.fail_bound(job.seqs)  # what was rejected stays so
            logger.warning(
                "handler %r failed on %s after %d call(s)%s; the broker redelivers it (a "
                "redelivery in-process would come past half the ack timeout, %gs): %r",
                spec.id,
                describe(job),
                calls,
                gave_up,
                self._ack_timeout,
                exc,
                exc_info=exc if first else None,
            )
            return
        logger.warning(
            "handler %r failed on %s after %d call(s)%s; it is handed to this handler "
            "again in %.3gs (the other handlers go on)%s: %r",
            spec.id,
            describe(job),
            calls,
            gave_up,
            delay,
            " (give_up_after cannot apply: the producer's messages carry no attempt)"
            if limit is not None and len(attempts) < failing
            else "",
            exc,
            exc_info=exc if first else None,
        )
        self._park(job, delay)

    def _reject_each(self, job: Job, reasons: Mapping[int, str | None]) -> None:
        """Reject the messages of batch ``job`` at ``reasons``' indexes (into
        ``job.messages``), each with its reason; the others stay bound."""
        assert job.sizes is not None, "batch jobs hold batch bindings"
        start = 0
        for seq, size in zip(job.seqs, job.sizes, strict=True):
            by_reason: dict[str | None, list[int]] = {}
            for index in range(start, start + size):
                if index in reasons:
                    by_reason.setdefault(reasons[index], []).append(index - start)
            for reason, indexes in by_reason.items():
                self._manager.reject_in_batch(seq, indexes, reason)
            start += size

    def _resolve_batch(self, job: Job, rejects: dict[str, Reject]) -> None:
        """A batch handler returned rejects: reject those messages, ack the rest."""
        apart = job.apart
        reasons: dict[int, str | None] = {}
        seen: set[str] = set()
        for index, message in enumerate(job.messages):
            reject = rejects.get(message.id)
            if reject is None or (apart is not None and index in apart):
                continue
            seen.add(message.id)
            reasons[index] = reject.reason
            logger.info(
                "handler %r rejected message id=%s: %s", self._spec.id, message.id, reject.reason
            )
        self._reject_each(job, reasons)
        self._counters.rejected += len(reasons)
        self._manager.confirm_persisted(job.seqs)  # acks the messages not rejected
        self._counters.handled += len(job.argument) - len(reasons)
        unknown = rejects.keys() - seen
        if unknown:
            logger.warning(
                "handler %r returned rejects for %d message id(s) not in its batch, ignored: %s",
                self._spec.id,
                len(unknown),
                ", ".join(sorted(unknown)[:5]),
            )
