"""A :class:`~ackgate.Service` handler's declaration and its counters.

``@service.handler(...)`` checks its options here, once, and keeps them in a
:class:`HandlerSpec`; the running handler counts what happened in
:class:`HandlerCounters`, and ``service.stats()`` reports :class:`HandlerStats`.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ackgate._contract.checks import check_int, check_number
from ackgate._contract.message import Message
from ackgate._contract.stats import GroupStats
from ackgate._core.subscription import Subscription
from ackgate._service.decode import Decoder, check_decoder
from ackgate._service.retry import Redelivery, Retry

Ordering = Literal["lane", "key", "none"]
ORDERINGS: tuple[Ordering, ...] = ("lane", "key", "none")

#: A handler: ``async def h(message) -> None`` or, batched, ``async def h(messages)``
#: returning ``None`` or ``{message.id: Reject(...)}``.
HandlerFunction = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One declared handler: its id (a roster member) and how it is called."""

    id: str
    function: HandlerFunction
    #: Calls in progress at once (batch calls, for a batch handler).
    concurrency: int
    ordering: Ordering
    retry: Retry
    #: > 1: a batch handler, called with up to this many messages.
    batch_size: int
    #: Batch handlers: seconds after the first message of a batch it is called at the latest.
    batch_wait: float
    #: A failure at ``Message.attempt >= give_up_after`` (this handler's count) becomes a
    #: reject, and a message handed past it is rejected without a call
    #: (``Calls._give_up_unresolved``); ``None``: never.
    give_up_after: int | None = None
    #: ``decode=``: the handler is handed copies whose ``value`` is the decoded body.
    decoder: Decoder | None = None
    #: The backoff before a failed message is handed to this handler again; ``None``:
    #: the service's.
    redelivery: Redelivery | None = None

    @property
    def batched(self) -> bool:
        return self.batch_size > 1


def check_spec(
    handler_id: object,
    function: object,
    *,
    concurrency: object,
    ordering: object,
    retry: object,
    batch_size: object,
    batch_wait: object,
    give_up_after: object = None,
    decode: object = None,
    redelivery: object = None,
) -> HandlerSpec:
    """Validate ``@service.handler`` arguments: ``ValueError``/``TypeError`` naming each."""
    if not isinstance(handler_id, str) or not handler_id:
        raise ValueError(f"a handler id is a non-empty str, got {handler_id!r}")
    if not _is_async_function(function):
        raise TypeError(
            f"handler {handler_id!r} must be an async def function (a coroutine function), "
            f"got {function!r}"
        )
    concurrency = check_int(f"handler {handler_id!r}: concurrency", concurrency, minimum=1)
    if ordering not in ORDERINGS:
        raise ValueError(
            f'handler {handler_id!r}: ordering must be "lane", "key" or "none", got {ordering!r}'
        )
    if not isinstance(retry, Retry):
        raise TypeError(f"handler {handler_id!r}: retry must be a Retry, got {retry!r}")
    batch_size = check_int(f"handler {handler_id!r}: batch_size", batch_size, minimum=1)
    batch_wait = check_number(f"handler {handler_id!r}: batch_wait", batch_wait, minimum=0)
    if batch_size == 1 and batch_wait:
        raise ValueError(
            f"handler {handler_id!r}: batch_wait applies to batch handlers only (batch_size > 1)"
        )
    if batch_size > 1 and concurrency > 1 and ordering != "none":
        raise ValueError(
            f"handler {handler_id!r}: concurrent batches (concurrency={concurrency}) are not "
            f'kept in stream order: pass ordering="none", or concurrency=1'
        )
    if give_up_after is not None:
        give_up_after = check_int(
            f"handler {handler_id!r}: give_up_after", give_up_after, minimum=1
        )
    if redelivery is not None and not isinstance(redelivery, Redelivery):
        raise TypeError(
            f"handler {handler_id!r}: redelivery must be a Redelivery or None, got {redelivery!r}"
        )
    _check_takes_one_argument(handler_id, function, batched=batch_size > 1)
    _check_annotation(handler_id, function, batch_size)
    decoder = check_decoder(f"handler {handler_id!r}", decode)
    assert callable(function)
    return HandlerSpec(
        id=handler_id,
        function=function,
        concurrency=concurrency,
        ordering=ordering,
        retry=retry,
        batch_size=batch_size,
        batch_wait=batch_wait,
        give_up_after=give_up_after,
        decoder=decoder,
        redelivery=redelivery,
    )


def _is_async_function(function: object) -> bool:
    """An ``async def`` function or method (``functools.partial`` of one included), or
    an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        type(function).__call__
    )


def _check_takes_one_argument(handler_id: str, function: object, *, batched: bool) -> None:
    """Refuse a function that cannot be called with one positional argument (the
    message, or the list of them), at decoration rather than at its first call."""
    assert callable(function)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (some C callables): trust it
        return
    try:
        signature.bind(None)
    except TypeError as error:
        takes = "a list of Message (a batch handler)" if batched else "one Message"
        empty = inspect.Parameter.empty
        shown = signature.replace(
            parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
            return_annotation=empty,
        )
        raise TypeError(
            f"handler {handler_id!r}: {_name(function)}{shown} cannot be called with "
            f"{takes} as its only argument ({error})"
        ) from None


def _check_annotation(handler_id: str, function: object, batch_size: int) -> None:
    """Refuse a handler whose first parameter's annotation says the other shape: a
    list of messages without ``batch_size`` (it would fail on every message, forever
    redelivered), or one ``Message`` with ``batch_size`` (it would get lists)."""
    shape = _annotated_shape(function)
    if shape == "list" and batch_size == 1:
        raise TypeError(
            f"handler {handler_id!r}: its parameter is annotated as a list of messages, but "
            "it is registered as a per-message handler: pass batch_size=N (> 1) for a batch "
            "handler, or annotate it as one Message"
        )
    if shape == "one" and batch_size > 1:
        raise TypeError(
            f"handler {handler_id!r}: batch_size={batch_size} makes it a batch handler, "
            "called with a list of messages, but its parameter is annotated as one Message: "
            "annotate it list[Message], or drop batch_size"
        )


def _annotated_shape(function: object) -> Literal["list", "one"] | None:
    """``"list"``, ``"one"`` (a ``Message``) or ``None`` (unannotated, or anything
    else) for the first parameter of ``function``; string annotations are read as text
    when they cannot be evaluated."""
    try:
        parameters = list(inspect.signature(function, eval_str=True).parameters.values())  # type: ignore[arg-type]
    except (NameError, TypeError, ValueError, SyntaxError):
        try:
            parameters = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    if not parameters:
        return None
    annotation = parameters[0].annotation
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
        head = text.split("[", 1)[0].rsplit(".", 1)[-1]
        if "[" in text and head in ("list", "List", "Sequence", "Iterable"):
            return "list"
        return "one" if head == "Message" else None
    origin = typing.get_origin(annotation)
    if annotation is list or origin in (
        list,
        collections.abc.Sequence,
        collections.abc.Iterable,
    ):
        return "list"
    if annotation is Message or origin is Message:
        return "one"
    return None


def _name(function: object) -> str:
    if isinstance(function, functools.partial):
        return f"functools.partial({_name(function.func)})"
    return getattr(function, "__qualname__", None) or type(function).__qualname__


@dataclass(frozen=True, slots=True)
class HandlerStats:
    """What one handler of a service has done since ``run()`` started (messages, not calls).

    Each message the handler resolved counts in exactly one of ``handled``,
    ``rejected`` and ``gave_up``; ``failed`` counts its hand-outs that failed (a
    message failed twice, then acked, counts 2 there and 1 in ``handled``). Messages
    abandoned by a stop, a restart or an ack timeout (left to redelivery) count in
    none of them.

    Attributes:
        id: The handler id.
        handled: Acked: the call returned (for a batch handler, not rejected by its
            result).
        rejected: Rejected: ``Reject`` raised, or returned for it by a batch handler.
        failed: Hand-outs that failed after every ``Retry`` call: each is handed to
            the handler again after its redelivery backoff (a message failing three
            times counts 3), or, past half the ack timeout, redelivered by the broker.
        gave_up: Rejected by ``give_up_after``: failed at ``Message.attempt >=
            give_up_after``, or handed with ``attempt > give_up_after`` (never
            called). They are dead-lettered once every handler is done with them.
        retried: Retries made (a call of 3 attempts on a batch of 10 counts 20).
        in_progress: Messages in a handler call right now (retry backoffs included).
        redeliveries_skipped: Redelivered copies this handler was not handed
            because it had acked an earlier copy (docs/concepts.md#redelivery-memory).
        awaiting_redelivery: Messages this handler failed that wait out their
            redelivery backoff right now.
        behind: Messages read from the broker that this handler has not finished
            yet (queued for it, or in its calls): how far it is behind what was
            fetched. 0 while no group is live.
    """

    id: str
    handled: int
    rejected: int
    failed: int
    retried: int
    in_progress: int
    redeliveries_skipped: int = 0
    gave_up: int = 0
    awaiting_redelivery: int = 0
    behind: int = 0


@dataclass(frozen=True, slots=True)
class OldestMessage:
    """The oldest message a service read and has not advanced past (committed,
    deleted, acked, completed), and who holds it.

    Attributes:
        lane: Its lane (a Kafka partition, an SQS FIFO group...).
        key: Its :attr:`Message.key` (``None`` when it has none).
        id: Its :attr:`Message.id`.
        handlers: The handlers that have not finished it, in registration order;
            ``()`` when every one did and only the advance (of it or of an earlier
            message of its lane) is pending.
        age: Seconds since it was read.
    """

    lane: Hashable
    key: Hashable
    id: str
    handlers: tuple[str, ...]
    age: float


class HandlerCounters:
    """The live counters behind :class:`HandlerStats`. Invariant: every field >= 0."""

    __slots__ = (
        "awaiting_redelivery",
        "bad_return_logged",
        "failed",
        "gave_up",
        "handled",
        "in_progress",
        "live",
        "rejected",
        "retried",
        "skipped_in_ended_groups",
    )

    def __init__(self) -> None:
        self.handled = 0
        self.rejected = 0
        self.failed = 0
        self.gave_up = 0
        self.retried = 0
        self.in_progress = 0
        self.awaiting_redelivery = 0
        #: The handler's latest subscription; its group counts the skipped copies.
        self.live: Subscription | None = None
        self.skipped_in_ended_groups = 0
        #: Set once a call returned something it must not: that is logged once.
        self.bad_return_logged = False

    def subscribed(self, subscription: Subscription) -> None:
        """Caller: the handler's worker, after each ``subscribe``. A group counts
        skipped copies per subscriber id for its whole life, so only a new group
        moves the last one's count into ``skipped_in_ended_groups``."""
        last = self.live
        if last is not None and last._group is not subscription._group:
            self.skipped_in_ended_groups += last.redeliveries_skipped
        self.live = subscription

    def snapshot(self, handler_id: str, behind: int = 0) -> HandlerStats:
        return HandlerStats(
            id=handler_id,
            handled=self.handled,
            rejected=self.rejected,
            failed=self.failed,
            retried=self.retried,
            in_progress=self.in_progress,
            redeliveries_skipped=self.skipped_in_ended_groups
            + (self.live.redeliveries_skipped if self.live is not None else 0),
            gave_up=self.gave_up,
            awaiting_redelivery=self.awaiting_redelivery,
            behind=behind,
        )


@dataclass(frozen=True, slots=True)
class ServiceStats:
    """A snapshot of a service, as returned by :meth:`Service.stats`.

    Attributes:
        key: The service's key.
        state: ``"new"`` (before ``run()``), ``"running"`` or ``"stopped"``.
        group: The group's statistics; ``None`` while no group is live (before
            ``run()``, during a restart backoff, after the stop).
        handlers: Per handler id, in registration order.
        restarts: Times the group was restarted after it ended.
        oldest: The oldest message read and not advanced yet, named; ``None`` when
            none (or no group is live). It does not make the service unready.
        refused: While no group is live because the broker refused the last one and
            ``retry_on_auth_error`` retries it, the refusal's reason ("authentication
            failed for user alice (SCRAM-SHA-512)"); else ``None``.
    """

    key: Hashable
    state: Literal["new", "running", "stopped"]
    group: GroupStats | None
    handlers: Mapping[str, HandlerStats]
    restarts: int
    oldest: OldestMessage | None = None
    refused: str | None = None
