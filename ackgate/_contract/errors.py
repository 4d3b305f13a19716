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


class PermanentUpstreamError(AckGateError):
    """The broker refused this producer for a reason no reconnect mends: raise it
    (or a subclass) from :meth:`~ackgate.SharedStreamProducer.open_stream` or
    :meth:`~ackgate.SharedStreamProducer.advance`.

    A service treats it as a configuration error
    (docs/production.md#permanent-errors-and-exit-codes): its ``run()`` raises it,
    and ``ackgate run`` exits 1 naming it, unless the service was made with
    ``retry_on_auth_error=SECONDS`` (credentials being rotated), which starts the
    group again every ``SECONDS``.

    ``str(error)`` is the one line an operator reads ("authentication failed for
    user alice (SCRAM-SHA-512)"): it names the identity and the mechanism, never a
    secret. ``address`` is the broker as the operator knows it (host and port, a
    queue URL, a namespace).
    """

    def __init__(self, reason: str, *, address: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.address = address


class AuthenticationFailed(PermanentUpstreamError):
    """The broker refused the credentials, or the identity lacks a permission it needs."""


class TLSVerificationFailed(PermanentUpstreamError):
    """The broker's TLS certificate is not trusted (wrong CA, wrong host name, expired)."""
