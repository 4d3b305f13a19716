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


class _Refused(PermanentError):
    """The broker refused this producer's identity or connection: what
    ``retry_on_auth_error`` retries. ``str(error)`` is the one line an operator reads
    ("authentication failed for user alice (SCRAM-SHA-512)"): it names the identity
    and the mechanism, never a secret. ``address`` is the broker as the operator
    knows it (host and port, a queue URL, a namespace)."""

    def __init__(self, reason: str, *, address: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.address = address


class AuthenticationFailed(_Refused):
    """The broker refused the credentials, or the identity lacks a permission it needs.

    A :class:`PermanentError`: raise it from ``open_stream`` or ``advance``, chained to
    the SDK's error. A service's ``run()`` raises it (``ackgate run`` exits 1 naming it),
    unless the service was made with ``retry_on_auth_error=SECONDS`` (credentials being
    rotated), which starts the group again every ``SECONDS``. ``reason`` is its one
    line ("authentication failed for user alice (SCRAM-SHA-512)", never a secret),
    ``address`` the broker as the operator knows it.
    """


class TLSVerificationFailed(_Refused):
    """The broker's TLS certificate is not trusted (wrong CA, wrong host name, expired).

    A :class:`PermanentError`, retried like :class:`AuthenticationFailed` under
    ``retry_on_auth_error``; ``reason`` reads "TLS: the broker's certificate is not
    trusted (CERTIFICATE_VERIFY_FAILED: ...)".
    """
