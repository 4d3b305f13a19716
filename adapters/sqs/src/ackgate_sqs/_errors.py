"""How the SQS adapter reads botocore's errors: a refusal no retry mends
(docs/production.md#security), an outage to ride out, or neither (the request was
wrong: it ends the group). And the ``create_client`` whose keywords
``client_options`` are checked against."""

from __future__ import annotations

from typing import Any

from ackgate import AuthenticationFailed, TLSVerificationFailed

#: Error codes with which AWS refuses the caller's credentials or permissions.
_REFUSED_CODES = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "ExpiredToken",
        "ExpiredTokenException",
        "MissingAuthenticationToken",
        "AccessDenied",
        "AccessDeniedException",
    }
)


def refusal(
    error: BaseException, address: str
) -> AuthenticationFailed | TLSVerificationFailed | None:
    """``error`` as a refusal no retry mends (credentials, permissions, TLS), if it is one."""
    from botocore.exceptions import ClientError, NoCredentialsError, SSLError

    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        if code in _REFUSED_CODES:
            what = "access denied" if code.startswith("AccessDenied") else "authentication failed"
            return AuthenticationFailed(
                f"{what} ({code}): {error.response.get('Error', {}).get('Message', '')}",
                address=address,
            )
    if isinstance(error, NoCredentialsError):
        return AuthenticationFailed(f"authentication failed: {error}", address=address)
    if isinstance(error, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(error):
        return TLSVerificationFailed(
            "TLS: the endpoint's certificate is not trusted (CERTIFICATE_VERIFY_FAILED)",
            address=address,
        )
    return None


def unreachable(error: BaseException) -> bool:
    """An error that says SQS could not be reached (or failed on its side), not that
    the request was wrong: an outage to ride out rather than a reason to stop."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(error, ConnectionError | HTTPClientError | OSError | TimeoutError):
        return True
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return isinstance(status, int) and status >= 500
    return False


def create_client() -> Any:
    """The ``create_client`` whose keywords ``client_options`` go to: aiobotocore's
    takes ``*args, **kwargs`` and hands them to botocore's, whose signature names them."""
    try:
        import aiobotocore.session  # noqa: F401 - the SDK this adapter needs
        from botocore.session import Session
    except ImportError as exc:
        raise ImportError("ackgate-sqs needs aiobotocore: pip install 'ackgate[sqs]'") from exc
    return Session.create_client
