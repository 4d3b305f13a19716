"""The adapter's exception, raised from the producer and from its parts; the SDK's
refusals as ackgate's (docs/production.md#security); ``client_options`` as a ``repr``
shows them."""

from typing import Any

from ackgate import AckGateError, AuthenticationFailed, masked_options


class PubSubError(AckGateError):
    """A Pub/Sub call failed. ``__cause__`` is the SDK's exception."""


def refusal(error: Any, doing: str, address: str) -> AuthenticationFailed:
    """A ``PERMISSION_DENIED`` or ``UNAUTHENTICATED`` answer to ``doing`` ("pulling
    projects/p/subscriptions/s") as the refusal it is, naming the gRPC status."""
    code = getattr(error, "grpc_status_code", None)
    status = code.name if code is not None else type(error).__name__
    what = "access denied" if status == "PERMISSION_DENIED" else "refused"
    return AuthenticationFailed(f"{what} {doing} ({status}): {error.message}", address=address)


def shown_options(client_options: Any) -> Any:
    """``client_options`` for a ``repr``: a dict or a ``ClientOptions``, secrets masked."""
    if client_options is None:
        return None
    fields = client_options if isinstance(client_options, dict) else vars(client_options)
    return masked_options(fields)
