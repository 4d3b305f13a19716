"""The dead-letter copy of a rejected Kafka record (docs/concepts.md#deferred-resolution reasons in
a header), and the connection options the DLQ producer shares with the consumer."""

from __future__ import annotations

from typing import Any

from ackgate import AdvanceOutcome

# Connection-level options that the DLQ producer must share with the consumer, so a
# secured cluster is reached the same way by both.
SHARED_CONNECTION_OPTIONS = frozenset(
    {
        "client_id",
        "api_version",
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "sasl_oauth_token_provider",
        "connections_max_idle_ms",
        "request_timeout_ms",
        "metadata_max_age_ms",
        "retry_backoff_ms",
    }
)


def reason(outcome: AdvanceOutcome, total: int) -> str:
    """The ``ackgate.reason`` header: the count, then the subscribers' reasons
    (docs/concepts.md#deferred-resolution)."""
    summary = f"rejected by {outcome.rejected} of {total} subscribers"
    return f"{summary}: {'; '.join(outcome.reasons)}" if outcome.reasons else summary


def dead_letter_headers(record: Any, outcome: AdvanceOutcome) -> list[tuple[str, bytes]]:
    """The record's own headers, then where it came from and why it was rejected."""
    total = outcome.acked + outcome.failed + outcome.rejected
    return [
        *(record.headers or ()),
        ("ackgate.original.topic", record.topic.encode()),
        ("ackgate.original.partition", str(record.partition).encode()),
        ("ackgate.original.offset", str(record.offset).encode()),
        ("ackgate.reason", reason(outcome, total).encode()),
    ]
