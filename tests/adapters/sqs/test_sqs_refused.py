"""AWS refusing the credentials or a permission is a refusal, not an outage
(docs/production.md#security): ``AuthenticationFailed`` naming AWS's error code; an
endpoint certificate not trusted is ``TLSVerificationFailed``. A server error stays an
outage. No server needed: the errors are botocore's own."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, NoCredentialsError, SSLError

from ackgate import AuthenticationFailed, TLSVerificationFailed
from ackgate_sqs._errors import refusal

QUEUE = "https://sqs.eu-west-1.amazonaws.com/1/orders"


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} (test)"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "ReceiveMessage",
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("InvalidClientTokenId", "authentication failed (InvalidClientTokenId)"),
        ("SignatureDoesNotMatch", "authentication failed (SignatureDoesNotMatch)"),
        ("AccessDenied", "access denied (AccessDenied)"),
    ],
)
def test_refused_credentials_and_permissions_are_authentication_failed(
    code: str, expected: str
) -> None:
    refused = refusal(client_error(code, 403), QUEUE)
    assert isinstance(refused, AuthenticationFailed)
    assert str(refused).startswith(expected) and refused.address == QUEUE


def test_missing_credentials_and_an_untrusted_endpoint_are_refusals_too() -> None:
    assert isinstance(refusal(NoCredentialsError(), QUEUE), AuthenticationFailed)
    untrusted = SSLError(
        endpoint_url=QUEUE, error="[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
    )
    assert isinstance(refusal(untrusted, QUEUE), TLSVerificationFailed)


def test_a_server_error_is_norefusal() -> None:
    assert refusal(client_error("InternalError", 500), QUEUE) is None
