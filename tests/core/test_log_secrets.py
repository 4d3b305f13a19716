"""No secret in a log line (docs/production.md#security): ``ackgate run --log-level
DEBUG`` is ackgate's and the services' own loggers; the broker clients' stay at INFO
unless ``--client-log-level`` asks, and their lines are redacted either way."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ackgate._operating.log_setup import RedactFilter, redact

PASSWORD = "s3cr3t-Pa55"
SASL_LINE = (
    "<AIOKafkaConnection host=broker port=9093> Request 3: "
    f"SaslAuthenticateRequest_v1(sasl_auth_bytes=b'alice\\x00alice\\x00{PASSWORD}')"
)

# What ``ackgate run`` does before importing the services, then one DEBUG line of
# ackgate, of a service module and of aiokafka's connection logger.
SCRIPT = f"""
import logging, sys
from ackgate._operating.log_setup import configure_logging
configure_logging("DEBUG", sys.argv[1] if len(sys.argv) > 1 else None, worker=None)
logging.getLogger("ackgate.service").debug("ackgate debug line")
logging.getLogger("myapp.consumers").debug("service debug line")
logging.getLogger("aiokafka.conn").debug({SASL_LINE!r})
logging.getLogger("aiokafka.consumer").info("Unable connect to broker: password=%s", {PASSWORD!r})
"""


def logged(*client_level: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *client_level],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stderr


def test_log_level_debug_is_ackgate_and_the_services_not_the_clients_wire() -> None:
    out = logged()
    assert "ackgate debug line" in out and "service debug line" in out
    assert "SaslAuthenticateRequest" not in out  # aiokafka stays at INFO
    assert "Unable connect to broker: password=<redacted>" in out
    assert PASSWORD not in out


def test_client_log_level_debug_is_asked_for_warned_about_and_still_redacted() -> None:
    out = logged("DEBUG")
    assert "sasl_auth_bytes=<23 bytes redacted>" in out
    assert "--client-log-level DEBUG" in out and "do not ship these logs" in out
    assert PASSWORD not in out


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        (SASL_LINE, PASSWORD),
        ("ConsumerRecord(topic='t', key=b'customer-42', value=b'{\"card\": 4111}')", "4111"),
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=Zm9v=",
            "Zm9v",
        ),
        ("sending headers {'Authorization': 'AWS4-HMAC-SHA256 Credential=AKIA/x'}", "AWS4"),
        ("config sasl_plain_password='hunter2' ok", "hunter2"),
    ],
)
def test_redact_removes_credentials_and_bodies(text: str, secret: str) -> None:
    assert secret not in redact(text)


def test_ackgate_lines_are_left_alone_and_others_rewritten() -> None:
    ours = logging.LogRecord("ackgate.run", logging.INFO, "", 0, "key=%r", (b"k",), None)
    theirs = logging.LogRecord("aiokafka.conn", logging.DEBUG, "", 0, "%s", (SASL_LINE,), None)
    redaction = RedactFilter()
    assert redaction.filter(ours) and ours.getMessage() == "key=b'k'"
    assert redaction.filter(theirs) and PASSWORD not in theirs.getMessage()
