"""What the installed distributions declare: version, adapter entry points, ``ackgate adapters``."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points, version
from pathlib import Path

import pytest

import ackgate
from ackgate._operating import cli as _cli

ADAPTERS = {
    "memory": ("ackgate", "ackgate.adapters.memory:MemoryStreamProducer"),
    "kafka": ("ackgate-kafka", "ackgate_kafka:KafkaStreamProducer"),
    "sqs": ("ackgate-sqs", "ackgate_sqs:SqsStreamProducer"),
    "pubsub": ("ackgate-pubsub", "ackgate_pubsub:PubSubStreamProducer"),
    "servicebus": ("ackgate-servicebus", "ackgate_servicebus:ServiceBusStreamProducer"),
}


def test_version_is_the_distributions() -> None:
    assert ackgate.__version__ == version("ackgate")


def test_version_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"ackgate {ackgate.__version__}\n"


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_adapter_registers_its_producer(name: str) -> None:
    (entry,) = entry_points(group="ackgate.adapters", name=name)
    distribution, path = ADAPTERS[name]
    assert entry.dist is not None and entry.dist.name == distribution
    assert entry.value == path
    assert issubclass(entry.load(), ackgate.SharedStreamProducer)


def test_adapters_lists_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["adapters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines] == [
        [name, distribution, version(distribution), path]
        for name, (distribution, path) in sorted(ADAPTERS.items())
    ]


def test_adapters_imports_no_adapter_or_client(tmp_path: Path) -> None:
    modules = [
        "ackgate_kafka",
        "ackgate_sqs",
        "ackgate_pubsub",
        "ackgate_servicebus",
        "aiokafka",
        "aiobotocore",
        "google.pubsub_v1",
        "azure.servicebus",
    ]
    script = (
        "import sys\n"
        "from ackgate._operating.cli import main\n"
        "assert main(['adapters']) == 0\n"
        f"print('imported:', [m for m in {modules!r} if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "imported: []"


def test_ci_runs_the_readme_test_command() -> None:
    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text()
    section = readme.split("## Run the tests\n", 1)[1]  # a skip comment may precede the block
    command = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    assert command.startswith("python3 -m venv .venv && ")
    assert command in (repo / ".ci" / "run").read_text().splitlines()
