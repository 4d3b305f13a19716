"""Real brokers for tests and development: an address you give, a container, or a local process.

:func:`broker` is a context manager that yields the connection settings of a running
broker and stops whatever it started on exit. It tries, in this order:

1. **given**: the address in the broker's variable (``ACKGATE_KAFKA_BOOTSTRAP``,
   ``ACKGATE_SQS_ENDPOINT``, ``PUBSUB_EMULATOR_HOST``, ``ACKGATE_SERVICEBUS_CONNECTION``).
   It must answer; a given address that does not is a failure, never a fallback.
2. **container**: through testcontainers, when a Docker API answers. Images are
   overridable (``ACKGATE_KAFKA_IMAGE``, ``ACKGATE_SQS_IMAGE``, ``ACKGATE_PUBSUB_IMAGE``,
   ``ACKGATE_SERVICEBUS_IMAGE``, ``ACKGATE_SERVICEBUS_SQL_IMAGE``).
3. **local**: a child process (Kafka from Maven jars, moto's server, the Cloud SDK's
   Pub/Sub emulator). Service Bus has none.

``ACKGATE_BROKERS=container`` or ``local`` allows only that path; ``auto`` (the
default) tries the container, then the local process. When nothing works,
:class:`NoBroker` says what was tried and why each path failed.

For development::

    python -m ackgate.testing.brokers up kafka [--container | --local]

prints ``export ACKGATE_KAFKA_BOOTSTRAP=127.0.0.1:39092`` and runs until Ctrl-C or SIGTERM;
``topic create NAME --partitions N`` and ``produce TOPIC [FILE] [--key-separator SEP]``
create a Kafka topic and produce one record per line there; ``wait TOPIC --group GROUP``
exits once the group has committed everything on it. ``consume TOPIC [--from-beginning]
[--max N] [--group GROUP]`` prints the records there (offsets, key, headers, value), and
``offsets GROUP [TOPIC]`` a group's committed offsets, end offsets and lag per partition.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Literal, TextIO

from ackgate.testing import _local

__all__ = [
    "Broker",
    "KafkaBroker",
    "NoBroker",
    "PubSubBroker",
    "ServiceBusBroker",
    "SqsBroker",
    "broker",
    "brokers_mode",
]

Kind = Literal["kafka", "sqs", "pubsub", "servicebus"]
KINDS: tuple[Kind, ...] = ("kafka", "sqs", "pubsub", "servicebus")
Mode = Literal["auto", "container", "local"]


@dataclass(frozen=True)
class KafkaBroker:
    """A Kafka broker: give ``bootstrap`` to the adapter as ``bootstrap_servers``."""

    bootstrap: str
    origin: str = "given"

    def env(self) -> dict[str, str]:
        return {"ACKGATE_KAFKA_BOOTSTRAP": self.bootstrap}


@dataclass(frozen=True)
class SqsBroker:
    """An SQS endpoint with the region and (dummy) credentials that go with it.

    ``server`` is ``"moto"`` when moto answers (its FIFO queues reorder a message group
    after a visibility timeout, real SQS does not), else ``"sqs"``.
    """

    endpoint_url: str
    region_name: str = "us-east-1"
    aws_access_key_id: str = "testing"
    aws_secret_access_key: str = "testing"
    server: str = "sqs"
    origin: str = "given"

    def env(self) -> dict[str, str]:
        return {
            "ACKGATE_SQS_ENDPOINT": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region_name,
            "AWS_ACCESS_KEY_ID": self.aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.aws_secret_access_key,
        }


@dataclass(frozen=True)
class PubSubBroker:
    """A Pub/Sub emulator: the Google clients find it through ``PUBSUB_EMULATOR_HOST``."""

    emulator_host: str
    project: str = "ackgate-test"
    origin: str = "given"

    def env(self) -> dict[str, str]:
        return {"PUBSUB_EMULATOR_HOST": self.emulator_host}


@dataclass(frozen=True)
class ServiceBusBroker:
    """A Service Bus (emulator) namespace, as a connection string."""

    connection_string: str
    origin: str = "given"

    def env(self) -> dict[str, str]:
        return {"ACKGATE_SERVICEBUS_CONNECTION": self.connection_string}


Broker = KafkaBroker | SqsBroker | PubSubBroker | ServiceBusBroker

GIVEN = {
    "kafka": "ACKGATE_KAFKA_BOOTSTRAP",
    "sqs": "ACKGATE_SQS_ENDPOINT",
    "pubsub": "PUBSUB_EMULATOR_HOST",
    "servicebus": "ACKGATE_SERVICEBUS_CONNECTION",
}


@dataclass
class NoBroker(RuntimeError):
    """No path produced a broker. ``attempts`` pairs each path tried with why it failed."""

    kind: str
    attempts: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        tried = "\n".join(f"- {path}: {why}" for path, why in self.attempts)
        return f"no {self.kind} broker for the tests; tried:\n{tried}"


def brokers_mode() -> Mode:
    """``ACKGATE_BROKERS``: ``auto`` (default), ``container`` or ``local``."""
    mode = os.environ.get("ACKGATE_BROKERS", "auto").strip().lower() or "auto"
    if mode not in ("auto", "container", "local"):
        raise ValueError(f"ACKGATE_BROKERS={mode!r}: expected auto, container or local")
    return mode  # type: ignore[return-value]


def _given(kind: Kind, value: str) -> Broker:
    if kind == "kafka":
        if not asyncio.run(_local.kafka_metadata_ok(value)):
            raise _local.ServerDidNotStart("does not answer Kafka metadata requests")
        return KafkaBroker(value, origin="given")
    if kind == "sqs":
        endpoint = value.rstrip("/")
        if _local.http_status(f"{endpoint}/") is None:
            raise _local.ServerDidNotStart("does not answer HTTP")
        return SqsBroker(endpoint, server=_sqs_server(endpoint), origin="given")
    if kind == "pubsub":
        if not _local.pubsub_emulator_ready(value):
            raise _local.ServerDidNotStart("does not answer like the Pub/Sub emulator")
        return PubSubBroker(value, origin="given")
    return ServiceBusBroker(value, origin="given")  # checked by the first client that connects


def _sqs_server(endpoint: str) -> str:
    return "moto" if _local.answers(f"{endpoint}/moto-api/") else "sqs"


def _wrap(
    kind: Kind, origin: str, start: Callable[[], AbstractContextManager[str]]
) -> Generator[Broker, None, None]:
    with start() as address:
        if kind == "kafka":
            yield KafkaBroker(address, origin=origin)
        elif kind == "sqs":
            yield SqsBroker(address, server=_sqs_server(address), origin=origin)
        elif kind == "pubsub":
            yield PubSubBroker(address, origin=origin)
        else:
            yield ServiceBusBroker(address, origin=origin)


def _container_path(kind: Kind) -> tuple[str, Callable[[], AbstractContextManager[str]]]:
    from ackgate.testing import _containers

    name = _containers.image("servicebus" if kind == "servicebus" else kind)
    return f"container {name}", getattr(_containers, kind)


@contextmanager
def broker(kind: Kind, mode: Mode | None = None) -> Iterator[Broker]:
    """A running ``kind`` broker for the duration of the block (see the module docstring).

    Raises :class:`NoBroker` listing every path tried and why it failed.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown broker {kind!r}: expected one of {', '.join(KINDS)}")
    mode = mode or brokers_mode()
    failure = NoBroker(kind)
    given = os.environ.get(GIVEN[kind])
    if given:
        try:
            found = _given(kind, given)
        except Exception as exc:
            failure.attempts.append((f"{GIVEN[kind]}={given}", str(exc)))
            raise failure from None
        yield found
        return
    failure.attempts.append((GIVEN[kind], "not set"))
    paths: list[tuple[str, Callable[[], AbstractContextManager[str]]]] = []
    if mode in ("auto", "container"):
        try:
            from ackgate.testing import _containers

            _containers.docker_client().close()
            paths.append(_container_path(kind))
        except Exception as exc:
            failure.attempts.append(("container", f"no Docker API: {exc}"))
    else:
        failure.attempts.append(("container", "not tried: ACKGATE_BROKERS=local"))
    if mode in ("auto", "local"):
        if kind == "servicebus":
            failure.attempts.append(("local", "no local Service Bus server exists"))
        else:
            paths.append((f"local {kind}", getattr(_local, kind)))
    else:
        failure.attempts.append(("local", "not tried: ACKGATE_BROKERS=container"))
    for origin, start in paths:
        running = _wrap(kind, origin, start)
        try:
            found = next(running)
        except Exception as exc:
            failure.attempts.append((origin, f"{type(exc).__name__}: {exc}"))
            continue
        try:
            yield found
        finally:
            running.close()
        return
    raise failure


def _up(kind: Kind, mode: Mode) -> int:
    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        with broker(kind, mode) as running:
            for name, value in running.env().items():
                print(f"export {name}={value}", flush=True)
            print(f"# {kind} from {running.origin}; Ctrl-C stops it", flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt:
        return 0
    except NoBroker as exc:
        print(exc, file=sys.stderr)
        return 1


def _bootstrap(given: str | None) -> str:
    bootstrap = given or os.environ.get(GIVEN["kafka"])
    if not bootstrap:
        raise SystemExit(
            f"no Kafka broker: pass --bootstrap HOST:PORT or set {GIVEN['kafka']} "
            "(python -m ackgate.testing.brokers up kafka prints it)"
        )
    return bootstrap


def _topic_create(bootstrap: str, name: str, partitions: int) -> int:
    from ackgate.testing.traffic import kafka_create_topic

    asyncio.run(kafka_create_topic(bootstrap, name, partitions))
    print(f"created topic {name} with {partitions} partition(s) on {bootstrap}")
    return 0


def _produce(bootstrap: str, topic: str, source: TextIO, separator: str | None) -> int:
    from ackgate.testing.traffic import Outgoing, kafka_publish

    def messages() -> Iterator[Outgoing]:
        for line in source:
            line = line.rstrip("\n")
            if separator is not None and separator in line:
                key, _, body = line.partition(separator)
                yield Outgoing(body, key=key)
            else:
                yield Outgoing(line)

    try:
        sent = asyncio.run(kafka_publish(bootstrap, topic, messages()))
    finally:
        if source is not sys.stdin:
            source.close()
    print(f"produced {sent} record(s) to {topic} on {bootstrap}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m ackgate.testing.brokers``."""
    parser = argparse.ArgumentParser(
        prog="python -m ackgate.testing.brokers",
        description="Start a broker for development, create a Kafka topic, produce records.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up",
        help="start a broker, print its address, stop on Ctrl-C",
        description="Start one broker the way the pytest fixtures do, print the variable "
        "that points tests and services at it, and stop it on Ctrl-C or SIGTERM. "
        "Without a flag: ACKGATE_BROKERS decides (auto: a container if a Docker API "
        "answers, else a local process).",
    )
    up.add_argument("kind", choices=KINDS, help="which broker to start")
    where = up.add_mutually_exclusive_group()
    where.add_argument(
        "--container",
        dest="mode",
        action="store_const",
        const="container",
        help="only through a container (testcontainers and a Docker API)",
    )
    where.add_argument(
        "--local",
        dest="mode",
        action="store_const",
        const="local",
        help="only as a local process (Kafka: Java 17 and Maven; SQS: moto's server)",
    )
    bootstrap_help = f"the Kafka broker (default: ${GIVEN['kafka']})"
    topic = commands.add_parser("topic", help="manage Kafka topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True)
    create = topic_commands.add_parser(
        "create",
        help="create a Kafka topic with N partitions",
        description="Create a Kafka topic. A topic Kafka auto-creates on first use has "
        "one partition: create it first to get more lanes.",
    )
    create.add_argument("name", help="the topic's name")
    create.add_argument(
        "--partitions", type=int, default=1, metavar="N", help="number of partitions (default 1)"
    )
    create.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help)
    produce = commands.add_parser(
        "produce",
        help="produce one Kafka record per line of stdin or a file",
        description="Produce one record per line, in order, each acknowledged by the broker.",
    )
    produce.add_argument("topic", help="the topic to produce to")
    produce.add_argument(
        "file",
        nargs="?",
        type=argparse.FileType("r"),
        default=sys.stdin,
        help="read lines from this file (default: stdin)",
    )
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="a line KEY<SEP>VALUE gets that key (records with one key share a partition, "
        "in order); a line without SEP has no key. Default: no keys",
    )
    produce.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help)
    wait = commands.add_parser(
        "wait",
        help="wait until a consumer group has committed everything on a Kafka topic",
        description="Exit 0 once GROUP has committed the end offset of every partition of "
        "TOPIC; exit 1 after --within seconds, naming the partitions still behind.",
    )
    wait.add_argument("topic", help="the topic the group reads")
    wait.add_argument("--group", required=True, help="the consumer group (the service's group_id)")
    wait.add_argument(
        "--within", type=float, default=60.0, metavar="SECONDS", help="give up after (default 60)"
    )
    wait.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help)
    consume = commands.add_parser(
        "consume",
        help="print the records of a Kafka topic: offsets, key, headers and value",
        description="Print the records TOPIC holds now, one line each, then exit. Without "
        "--group nothing is committed; with it, reading starts at the group's committed "
        "offsets and commits what it printed.",
    )
    consume.add_argument("topic", help="the topic to read")
    consume.add_argument(
        "--from-beginning",
        action="store_true",
        help="from the first record (default: from the end, or the group's committed offsets)",
    )
    consume.add_argument("--max", type=int, metavar="N", help="print at most N records")
    consume.add_argument("--group", help="read as this consumer group, and commit")
    consume.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help)
    offsets = commands.add_parser(
        "offsets",
        help="print a consumer group's committed offsets, end offsets and lag",
        description="One line per partition: committed offset, end offset and lag.",
    )
    offsets.add_argument("group", help="the consumer group")
    offsets.add_argument("topic", nargs="?", help="only this topic (all its partitions)")
    offsets.add_argument("--bootstrap", metavar="HOST:PORT", help=bootstrap_help)
    return parser


def _consume(bootstrap: str, topic: str, start: bool, limit: int | None, group: str | None) -> int:
    from ackgate.testing.traffic import kafka_read

    records = asyncio.run(
        kafka_read(bootstrap, topic, limit=limit, group=group, from_beginning=start)
    )
    for record in records:
        headers = " ".join(f"{name}={value!r}" for name, value in record.headers)
        print(
            f"{record.topic}/{record.partition}/{record.offset} key={record.key!r} "
            f"headers=[{headers}] value={record.value!r}"
        )
    print(f"{len(records)} record(s)", file=sys.stderr)
    return 0


def _offsets(bootstrap: str, group: str, topic: str | None) -> int:
    from ackgate.testing.traffic import kafka_offsets

    rows = asyncio.run(kafka_offsets(bootstrap, group, topic))
    print(f"{'TOPIC':<30} {'PARTITION':>9} {'COMMITTED':>10} {'END':>10} {'LAG':>8}")
    for row in rows:
        committed = "-" if row.committed is None else str(row.committed)
        print(f"{row.topic:<30} {row.partition:>9} {committed:>10} {row.end:>10} {row.lag:>8}")
    return 0


def _wait(bootstrap: str, topic: str, group: str, within: float) -> int:
    from ackgate.testing.traffic import StillOutstanding, kafka_wait_advanced

    try:
        asyncio.run(kafka_wait_advanced(bootstrap, topic, group, within))
    except StillOutstanding as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"group {group} has committed everything on {topic}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command in ("topic", "produce", "wait", "consume", "offsets"):
        from aiokafka.errors import KafkaError

        try:
            if args.command == "topic":
                return _topic_create(_bootstrap(args.bootstrap), args.name, args.partitions)
            if args.command == "produce":
                return _produce(
                    _bootstrap(args.bootstrap), args.topic, args.file, args.key_separator
                )
            if args.command == "consume":
                return _consume(
                    _bootstrap(args.bootstrap),
                    args.topic,
                    args.from_beginning,
                    args.max,
                    args.group,
                )
            if args.command == "offsets":
                return _offsets(_bootstrap(args.bootstrap), args.group, args.topic)
            return _wait(_bootstrap(args.bootstrap), args.topic, args.group, args.within)
        except KafkaError as exc:  # the broker's answer is the message; no traceback
            why = str(exc) if type(exc).__name__ in str(exc) else f"{type(exc).__name__}: {exc}"
            print(f"{parser().prog} {args.command}: {why}", file=sys.stderr)
            return 1
    # The variable that names a given address would short-circuit "up": ignore it here.
    os.environ.pop(GIVEN[args.kind], None)
    return _up(args.kind, args.mode or brokers_mode())


if __name__ == "__main__":
    sys.exit(main())
