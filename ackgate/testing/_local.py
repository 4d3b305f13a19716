"""Brokers as local processes: Kafka from Maven jars, moto's SQS server, the Pub/Sub emulator.

One way to do it everywhere: a free 127.0.0.1 port, the output in a log file, a
readiness probe polled until a deadline, and on exit terminate, then kill. Every
child gets SIGTERM when the process that started it dies (Linux), so a killed test
run leaves no broker process behind. Every failure raises :class:`ServerDidNotStart`
with the log tail.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy

KAFKA_POM = Path(__file__).resolve().parent / "kafka-pom.xml"
PUBSUB_EMULATOR = Path(
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
)
# Small heap and C1 only: the tests are short and the machine is shared.
TEST_JAVA_OPTS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


class ServerDidNotStart(RuntimeError):
    """The process exited or did not answer in time; the message ends with its log tail."""


BrokerError = ServerDidNotStart  # the name tests/support used for Kafka's failures


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str) -> int | None:
    """The HTTP status ``url`` answers a GET with, or ``None`` if nothing answers."""
    try:
        # moto's first answer takes over a second on a loaded machine; a closed port
        # is refused at once whatever the timeout.
        with _DIRECT.open(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return None


def answers(url: str, body: bytes | None = None) -> bool:
    """Whether ``url`` answers an HTTP GET with 2xx (and ``body``, stripped, if given)."""
    try:
        with _DIRECT.open(url, timeout=1) as response:
            return body is None or bool(response.read().strip() == body)
    except (OSError, urllib.error.URLError):
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _die_with_parent() -> None:
    """In the forked child: on Linux, get SIGTERM when the process that started us dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _stop(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextmanager
def local_server(
    argv: Sequence[str],
    *,
    ready: Callable[[], bool],
    log: Path,
    start_timeout: float,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv``, wait until ``ready()``, yield the process, stop it on exit.

    Raises :class:`ServerDidNotStart` if it exits first or ``start_timeout`` passes.
    """
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, preexec_fn=_die_with_parent
        )
    try:
        deadline = time.monotonic() + start_timeout
        while not ready():
            if process.poll() is not None or time.monotonic() > deadline:
                raise ServerDidNotStart(f"{argv[0]} did not start:\n{log_tail(log)}")
            time.sleep(0.1)
        yield process
    finally:
        _stop(process, timeout=10)


# --- Kafka -------------------------------------------------------------------------


def kafka_version() -> str:
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", KAFKA_POM.read_text())
    if match is None:
        raise ServerDidNotStart(f"{KAFKA_POM} defines no <kafka.version>")
    return match.group(1)


def kafka_libs() -> Path:
    """The cached Kafka jar directory, fetched with Maven (``kafka-pom.xml``) the first time
    into ``$XDG_CACHE_HOME/ackgate/kafka-<version>/libs`` (``~/.cache`` by default)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "ackgate" / f"kafka-{kafka_version()}"
    libs = home / "libs"
    if (home / "complete").exists():
        return libs
    if shutil.which("mvn") is None:
        raise ServerDidNotStart("fetching the Kafka broker jars needs Maven (mvn) on PATH")
    if shutil.which("java") is None:
        raise ServerDidNotStart("a local Kafka broker needs Java 17+ (java) on PATH")
    partial = home / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    command = ["mvn", "-q", "-B", "-f", str(KAFKA_POM), "dependency:copy-dependencies"]
    command.append(f"-DoutputDirectory={partial}")
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        output = (result.stdout + result.stderr)[-4000:]
        raise ServerDidNotStart(f"mvn could not fetch the Kafka broker jars:\n{output}")
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    (home / "complete").touch()
    return libs


async def kafka_metadata_ok(bootstrap: str) -> bool:
    """True if a broker at ``bootstrap`` answers a metadata request."""
    from aiokafka.admin import AIOKafkaAdminClient

    # A broker that is still starting makes aiokafka log an error per attempt: quiet.
    quiet = logging.getLogger("aiokafka")
    was_disabled, quiet.disabled = quiet.disabled, True
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await admin.start()
        await admin.list_topics()
        return True
    except Exception:
        return False
    finally:
        await admin.close()
        quiet.disabled = was_disabled


def wait_kafka(bootstrap: str, alive: Callable[[], str | None], timeout: float) -> None:
    """Poll metadata at ``bootstrap`` until it answers; ``alive()`` returns why the broker
    is gone (then this raises at once) or ``None``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gone = alive()
        if gone is not None:
            raise ServerDidNotStart(gone)
        if asyncio.run(kafka_metadata_ok(bootstrap)):
            return
        time.sleep(0.25)
    raise ServerDidNotStart(f"Kafka at {bootstrap} not ready after {timeout:.0f}s")


class LocalKafkaBroker:
    """One KRaft broker+controller on free 127.0.0.1 ports, storage under ``workdir``.

    ``with LocalKafkaBroker(workdir) as broker:`` starts it and waits until it answers a
    metadata request; leaving the block stops it (SIGTERM, then SIGKILL after 30 s).
    :meth:`kill` then :meth:`start` restarts it on the same storage and ports, with the
    topics, records and committed offsets it had.
    """

    start_timeout = 120.0

    def __init__(self, workdir: Path, java_opts: tuple[str, ...] = TEST_JAVA_OPTS) -> None:
        self.workdir = workdir
        self.java_opts = java_opts
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = workdir / "broker.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: Set once the storage is formatted: a later :meth:`start` reuses it.
        self._formatted = False

    def __enter__(self) -> LocalKafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log, lines)

    def start(self) -> None:
        """Format the storage (first start only) and start the broker; wait until it answers."""
        classpath = f"{kafka_libs()}/*"
        config = self._write_config()
        if not self._formatted:
            cluster_id = "-"
            while cluster_id.startswith("-"):  # the tool's parser takes "-..." for an option
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            storage = [
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(config),
                *self._format_options(),
            ]
            with self.log.open("ab") as out:
                formatted = subprocess.run(
                    ["java", *self.java_opts, "-cp", classpath, *storage],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=120,
                )
            if formatted.returncode != 0:
                raise ServerDidNotStart(f"Kafka storage format failed:\n{self.log_tail()}")
            self._formatted = True
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                ["java", *self.java_opts, "-cp", classpath, "kafka.Kafka", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            wait_kafka(self.bootstrap, self._exited, self.start_timeout)
        except ServerDidNotStart as exc:
            self.stop()
            raise ServerDidNotStart(f"{exc}:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL the broker: a crash, no clean shutdown. Its storage and ports stay,
        so :meth:`start` brings the same broker back (an outage, as clients see it)."""
        process, self.process = self.process, None
        if process is not None:
            process.kill()
            process.wait(timeout=30)

    def _exited(self) -> str | None:
        assert self.process is not None
        code = self.process.poll()
        return None if code is None else f"Kafka broker exited with {code}"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            _stop(process)

    def _format_options(self) -> list[str]:
        """More ``kafka-storage format`` arguments (a subclass adds SCRAM users)."""
        return []

    def _write_config(self) -> Path:
        config = self.workdir / "server.properties"
        settings = self._settings()
        config.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        return config

    def _settings(self) -> dict[str, str]:
        """``server.properties``: one PLAINTEXT listener and the KRaft controller."""
        listeners = f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            # Tests rebalance often: no initial delay, short sessions allowed.
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "1000",
        }
        return settings


@contextmanager
def kafka() -> Iterator[str]:
    """A local Kafka broker; yields its bootstrap address."""
    with (
        tempfile.TemporaryDirectory(prefix="ackgate-kafka-") as tmp,
        LocalKafkaBroker(Path(tmp)) as broker,
    ):
        yield broker.bootstrap


# --- SQS (moto) ---------------------------------------------------------------------


@contextmanager
def sqs() -> Iterator[str]:
    """moto's server (``moto[server]``) in a child process; yields its endpoint URL."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise ServerDidNotStart(
            f"a local SQS server needs moto[server] ({exc}); pip install 'ackgate[testing-sqs]'"
        ) from None
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with (
        tempfile.TemporaryDirectory(prefix="ackgate-moto-") as tmp,
        local_server(
            argv,
            ready=lambda: answers(f"{endpoint}/moto-api/"),
            log=Path(tmp, "moto.log"),
            start_timeout=30.0,
        ),
    ):
        yield endpoint


# --- Pub/Sub emulator ---------------------------------------------------------------


def pubsub_emulator_ready(host: str) -> bool:
    # The emulator answers a plain HTTP/1.1 GET / with "Ok" once it serves.
    return answers(f"http://{host}/", b"Ok")


@contextmanager
def pubsub() -> Iterator[str]:
    """The Cloud SDK's Pub/Sub emulator script (never through ``gcloud``, which writes into
    the home directory); ``ACKGATE_PUBSUB_EMULATOR_BIN`` overrides its path. Yields
    ``host:port``."""
    emulator = Path(os.environ.get("ACKGATE_PUBSUB_EMULATOR_BIN") or PUBSUB_EMULATOR)
    if not emulator.exists():
        raise ServerDidNotStart(
            f"the Pub/Sub emulator is not installed at {emulator} "
            "(apt-get install google-cloud-cli-pubsub-emulator, or set ACKGATE_PUBSUB_EMULATOR_BIN)"
        )
    port = free_port()
    host = f"127.0.0.1:{port}"
    argv = [str(emulator), "--host=127.0.0.1", f"--port={port}"]
    with (
        tempfile.TemporaryDirectory(prefix="ackgate-pubsub-") as tmp,
        local_server(
            argv,
            ready=lambda: pubsub_emulator_ready(host),
            log=Path(tmp, "emulator.log"),
            start_timeout=60.0,
            cwd=tmp,
        ),
    ):
        yield host
