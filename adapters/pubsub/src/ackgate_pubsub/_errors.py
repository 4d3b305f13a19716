"""The adapter's exception, raised from the producer and from its parts."""

from ackgate import AckGateError


class PubSubError(AckGateError):
    """A Pub/Sub call failed. ``__cause__`` is the SDK's exception."""
