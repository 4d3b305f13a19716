"""Exceptions raised to subscribers. All derive from :class:`AckGateError`."""

from __future__ import annotations


class AckGateError(Exception):
    """Base class of every exception ackgate raises on purpose."""


class AckTimeout(AckGateError):
    """The subscriber did not resolve an event within ``ack_timeout`` of its broadcast.

    Raised by the subscriber's next pull after it was force-failed.
    """


class SubscriberOverflow(AckGateError):
    """The subscriber's queue was full when an event was broadcast (``overflow="fail"``).

    Raised by the subscriber's next pull after it was force-failed.
    """


class StreamTerminated(AckGateError):
    """The group ended: the upstream returned or raised, or the manager was closed.

    ``__cause__`` carries the upstream's exception when there was one.
    """


class AdvanceFailed(StreamTerminated):
    """The producer's ``advance`` raised; the whole group ended.

    ``__cause__`` is the producer's exception. Nothing after the failed batch was
    advanced, so the broker redelivers it.
    """


class PermanentError(AckGateError):
    """A refusal the broker will repeat however often it is retried (a dead-letter
    topic that does not exist, a principal not authorised to write it).

    A producer raises it (from ``advance`` or ``open_stream``) instead of an error
    that a restart might mend. A :class:`~ackgate.Service` does not restart its group
    for it: ``run()`` raises it, and ``ackgate run`` exits 1 with one line naming it
    (docs/production.md#permanent-errors-and-exit-codes).
    """
