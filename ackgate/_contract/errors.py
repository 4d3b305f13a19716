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
