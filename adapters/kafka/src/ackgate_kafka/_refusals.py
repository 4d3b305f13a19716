"""Tell a broker's refusal from an outage (docs/production.md#security).

aiokafka reports every failed bootstrap as ``KafkaConnectionError: Unable to
bootstrap``, whether nothing answered, the broker refused the credentials or its
certificate was not trusted: the cause is only in aiokafka's own log line. So when
joining fails that way, :func:`diagnose` connects once more to each bootstrap
server exactly as the consumer's client does (same TLS context, same SASL
settings) and turns what that raises into ackgate's
:class:`~ackgate.AuthenticationFailed` or :class:`~ackgate.TLSVerificationFailed`,
which a service treats as permanent. Anything else (refused TCP, timeouts) stays an
outage. Authorization errors the broker returns to a joined client (group or topic
not allowed) are refusals too (:func:`refusal`).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from ackgate import AuthenticationFailed, TLSVerificationFailed

Refusal = AuthenticationFailed | TLSVerificationFailed

#: Seconds one diagnosing connection may take.
_DIAGNOSE_TIMEOUT = 10.0


def refusal(errors: Any, exc: BaseException, client: Any, address: str) -> Refusal | None:
    """``exc`` as a refusal, if it is one (aiokafka raised it to the caller itself, or
    :func:`diagnose` met it); ``client`` (aiokafka's, may be ``None``) names the user."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSVerificationFailed(
            f"TLS: the broker's certificate is not trusted ({exc.reason}: {exc.verify_message})",
            address=address,
        )
    if isinstance(exc, errors.SaslAuthenticationFailed | errors.AuthenticationFailedError):
        mechanism = getattr(client, "_sasl_mechanism", None) or "SASL"
        user = getattr(client, "_sasl_plain_username", None)
        who = f" for user {user}" if user else ""
        return AuthenticationFailed(f"authentication failed{who} ({mechanism})", address=address)
    if isinstance(exc, errors.UnsupportedSaslMechanismError):
        return AuthenticationFailed(f"authentication failed: {exc}", address=address)
    denied = (
        errors.GroupAuthorizationFailedError,
        errors.TopicAuthorizationFailedError,
        errors.ClusterAuthorizationFailedError,
    )
    if isinstance(exc, denied):
        user = getattr(client, "_sasl_plain_username", None)
        who = f" for user {user}" if user else ""
        return AuthenticationFailed(
            f"access denied{who}: {type(exc).__name__} (the ACLs do not allow it)",
            address=address,
        )
    return None


async def diagnose(aiokafka: Any, client: Any, address: str) -> Refusal | None:
    """Connect to each bootstrap server as ``client`` (aiokafka's ``AIOKafkaClient``)
    would; the broker's refusal if one refused it, ``None`` if none could be reached
    or all accepted (an outage, or a failure after the connection)."""
    for host, port, _ in client.hosts:
        try:
            async with asyncio.timeout(_DIAGNOSE_TIMEOUT):
                conn = await aiokafka.conn.create_conn(
                    host,
                    port,
                    client_id=client._client_id,
                    request_timeout_ms=client._request_timeout_ms,
                    ssl_context=client._ssl_context,
                    security_protocol=client._security_protocol,
                    sasl_mechanism=client._sasl_mechanism,
                    sasl_plain_username=client._sasl_plain_username,
                    sasl_plain_password=client._sasl_plain_password,
                    sasl_kerberos_service_name=client._sasl_kerberos_service_name,
                    sasl_kerberos_domain_name=client._sasl_kerberos_domain_name,
                    sasl_oauth_token_provider=client._sasl_oauth_token_provider,
                )
        except (OSError, TimeoutError, aiokafka.errors.KafkaError) as exc:
            found = refusal(aiokafka.errors, exc, client, address)
            if found is not None:
                return found
            continue
        conn.close()
    return None
