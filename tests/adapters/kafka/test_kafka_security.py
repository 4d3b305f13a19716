"""Kafka over a SASL_SSL listener (docs/production.md#security): the conformance
suite passes over it; the right credentials consume, commit and dead-letter;
refused credentials and an untrusted CA make ``ackgate run`` exit 1, naming the
cause in ackgate's own line; a misspelt option is refused at once; and no password
reaches a log line, even at ``--log-level DEBUG``.

One secured broker for the module (its start is ~10 s), next to the session's
plain one (the adapter tests' usual broker is untouched).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, errors

from ackgate import AuthenticationFailed, Message, Reject, Service, TLSVerificationFailed
from ackgate.testing._secured_kafka import SecuredKafkaBroker
from ackgate.testing.brokers import KafkaBroker
from ackgate.testing.conformance import ConformanceSuite
from ackgate.testing.resources import KafkaFresh
from ackgate_kafka import KafkaStreamProducer

from . import test_kafka_conformance as conformance
from .kafka_testlib import KafkaTestCluster

HERE = Path(__file__).resolve().parent
COUNT = 20
BAD = {3, 11}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafkaBroker]:
    with SecuredKafkaBroker(tmp_path_factory.mktemp("secured-kafka")) as broker:
        yield broker


def body(n: int) -> bytes:
    return b"bad %d" % n if n in BAD else b"good %d" % n


async def topics_with_messages(
    secured: SecuredKafkaBroker,
) -> tuple[KafkaTestCluster, str, str, str]:
    """A topic of ``COUNT`` messages and an empty DLQ, made over the PLAINTEXT listener."""
    plain = KafkaTestCluster(secured.bootstrap)
    topic, group, dlq = plain.unique("secured"), plain.unique("g"), plain.unique("dlq")
    await plain.create_topic(topic, 1)
    await plain.create_topic(dlq, 1)
    producer = AIOKafkaProducer(bootstrap_servers=secured.bootstrap)
    await producer.start()
    try:
        for n in range(COUNT):
            await producer.send_and_wait(topic, body(n))
    finally:
        await producer.stop()
    return plain, topic, group, dlq


def ackgate_run(
    secured: SecuredKafkaBroker,
    topic: str,
    *,
    stderr: Path,
    mechanism: str = "SCRAM-SHA-512",
    password: str | None = None,
    cafile: Path | None = None,
    extra_option: str = "",
    group: str = "g-refused",
    dlq: str = "dlq-refused",
    log_level: str = "INFO",
    client_log_level: str | None = None,
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SECURED_BOOTSTRAP": secured.secure_bootstrap,
        "SECURED_TOPIC": topic,
        "SECURED_GROUP": group,
        "SECURED_DLQ": dlq,
        "SECURED_MECHANISM": mechanism,
        "SECURED_PASSWORD": secured.password if password is None else password,
        "SECURED_CAFILE": str(cafile or secured.ca),
        "SECURED_EXTRA_OPTION": extra_option,
    }
    command = [sys.executable, "-m", "ackgate", "run", "secured_service:service"]
    command += ["--log-level", log_level]
    if client_log_level is not None:
        command += ["--client-log-level", client_log_level]
    return subprocess.Popen(
        command,
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("wb"),
    )


def exit_status_within(process: subprocess.Popen[bytes], seconds: float) -> tuple[int, float]:
    started = time.monotonic()
    try:
        code = process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"ackgate run still running after {seconds}s") from None
    return code, time.monotonic() - started


async def test_the_right_credentials_commit_to_the_end_and_write_the_dlq(
    secured: SecuredKafkaBroker,
) -> None:
    plain, topic, group, dlq = await topics_with_messages(secured)
    options = secured.client_options()
    bootstrap = options.pop("bootstrap_servers")

    def make() -> KafkaStreamProducer:
        return KafkaStreamProducer(
            topic, bootstrap_servers=bootstrap, group_id=group, dlq_topic=dlq, **options
        )

    service = Service("secured", producer=make)
    handled: list[bytes] = []

    @service.handler("auditor")
    async def audit(message: Message) -> None:
        if message.body.startswith(b"bad"):
            raise Reject("bad body")

    @service.handler("counter")
    async def count(message: Message) -> None:
        handled.append(message.body)

    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(60):
            await plain.wait_committed_to_end(group, topic, 1)
    finally:
        await service.stop(10)
        await task
    assert sorted(handled) == sorted(body(n) for n in range(COUNT))
    dead = await plain.read_all(dlq, len(BAD))
    assert sorted(record.value for record in dead) == sorted(body(n) for n in BAD)


@pytest.mark.parametrize("case", ["wrong password", "untrusted CA"])
async def test_a_refusal_is_told_from_an_outage_by_the_producer(
    secured: SecuredKafkaBroker, case: str
) -> None:
    refusal: type[Exception]
    if case == "wrong password":
        options = secured.client_options(sasl_plain_password="wrong")
        refusal, expected = (
            AuthenticationFailed,
            r"^authentication failed for user alice \(SCRAM-SHA-512\)$",
        )
    else:
        options = secured.client_options(ssl_context=secured.ssl_context(secured.other_ca))
        refusal, expected = (
            TLSVerificationFailed,
            r"^TLS: the broker's certificate is not trusted \(CERTIFICATE_VERIFY_FAILED: ",
        )
    bootstrap = options.pop("bootstrap_servers")
    producer = KafkaStreamProducer(
        "any", bootstrap_servers=bootstrap, group_id="g-refused", **options
    )
    stream = producer.open_stream()
    try:
        with pytest.raises(refusal, match=expected):
            async with asyncio.timeout(60):
                await anext(stream)
    finally:
        await stream.aclose()
        await producer.aclose()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "wrong password",
            "AuthenticationFailed: authentication failed for user alice (SCRAM-SHA-512)",
        ),
        (
            "untrusted CA",
            "TLSVerificationFailed: TLS: the broker's certificate is not trusted "
            "(CERTIFICATE_VERIFY_FAILED",
        ),
    ],
)
def test_ackgate_run_exits_1_naming_a_refusal(
    secured: SecuredKafkaBroker, tmp_path: Path, case: str, expected: str
) -> None:
    stderr = tmp_path / "run.err"
    if case == "wrong password":
        process = ackgate_run(secured, "any", stderr=stderr, password="wrong")
    else:
        process = ackgate_run(secured, "any", stderr=stderr, cafile=secured.other_ca)
    code, _ = exit_status_within(process, 60)
    out = stderr.read_text()
    assert code == 1, out
    ours = [
        line
        for line in out.splitlines()
        if " ERROR ackgate.run: service 'secured' failed: " in line
    ]
    assert len(ours) == 1 and expected in ours[0], out
    assert "restarting" not in out  # permanent: never taken for an outage


def test_a_misspelt_option_is_refused_at_once_naming_it(
    secured: SecuredKafkaBroker, tmp_path: Path
) -> None:
    stderr = tmp_path / "run.err"
    process = ackgate_run(secured, "any", stderr=stderr, extra_option="sasl_plain_pasword=x")
    code, took = exit_status_within(process, 15)
    out = stderr.read_text()
    assert code == 1, out
    assert "'sasl_plain_pasword' (did you mean 'sasl_plain_password'?)" in out
    assert took < 15


@pytest.mark.parametrize("client_log_level", [None, "DEBUG"])
async def test_no_password_in_any_line_of_a_debug_run_over_sasl_plain(
    secured: SecuredKafkaBroker, tmp_path: Path, client_log_level: str | None
) -> None:
    plain, topic, group, dlq = await topics_with_messages(secured)
    stderr = tmp_path / "run.err"
    process = ackgate_run(
        secured,
        topic,
        stderr=stderr,
        mechanism="PLAIN",
        group=group,
        dlq=dlq,
        log_level="DEBUG",
        client_log_level=client_log_level,
    )
    try:
        async with asyncio.timeout(60):
            waiting = asyncio.create_task(plain.wait_committed_to_end(group, topic, 1))
            while not waiting.done():
                if process.poll() is not None:
                    waiting.cancel()
                    raise AssertionError(f"exited {process.returncode}: {stderr.read_text()}")
                await asyncio.sleep(0.1)
            await waiting
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    out = stderr.read_text()
    assert f"handled {topic}/0/0" in out  # the services' own DEBUG lines are there
    assert " DEBUG ackgate." in out  # and ackgate's
    assert secured.password not in out
    if client_log_level is None:  # the clients' wire-level lines need --client-log-level
        assert " DEBUG aiokafka" not in out
    else:  # asked for: there, warned about, and their SASL bytes redacted
        assert "SaslAuthenticateRequest" in out and "sasl_auth_bytes=<" in out
        assert "do not ship these logs" in out


@pytest.mark.parametrize(
    "error", [errors.GroupAuthorizationFailedError, errors.TopicAuthorizationFailedError]
)
def test_an_acl_refusal_ends_the_group_as_authentication_failed(error: type[Exception]) -> None:
    """A broker with ACLs answers a join, a fetch, a commit or a DLQ write with these;
    the producer raises them as refusals, which a service does not retry."""
    producer = KafkaStreamProducer("orders", bootstrap_servers="b:9093", group_id="g")
    producer._errors = errors
    refused = producer._translate(error(), "commit failed")
    assert isinstance(refused, AuthenticationFailed)
    assert str(refused) == f"access denied: {error.__name__} (the ACLs do not allow it)"


class SecuredKafkaHarness(conformance.KafkaHarness):
    """The conformance harness with the producer under test (and its DLQ producer) on
    the SASL_SSL listener; topics, publishing and checks go through the PLAINTEXT one."""

    def __init__(self, secured: SecuredKafkaBroker) -> None:
        super().__init__(KafkaFresh(KafkaBroker(secured.bootstrap)))
        self.secured = secured

    def producer(self) -> KafkaStreamProducer:
        options = self.secured.client_options()
        bootstrap = options.pop("bootstrap_servers")
        return KafkaStreamProducer(
            self.topic,
            bootstrap_servers=bootstrap,
            group_id=self.group,
            dlq_topic=self.dlq,
            **options,
        )


class TestKafkaConformanceOverSaslSsl(ConformanceSuite):
    @pytest.fixture
    def harness(self, secured: SecuredKafkaBroker) -> SecuredKafkaHarness:
        return SecuredKafkaHarness(secured)
