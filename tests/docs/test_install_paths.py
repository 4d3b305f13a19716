"""The install commands of docs/getting-started.md are the ones CI runs from fresh venvs
(``.ci/install-paths``): one per user path, word for word."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PATHS = [
    "pip install .                                     # the core",
    "pip install '.[kafka]' ./adapters/kafka           # the core and the Kafka adapter",
    "pip install '.[kafka,testing]' ./adapters/kafka   # and the test tools",
]


def test_the_page_and_ci_install_the_same_way() -> None:
    page = (REPO / "docs" / "getting-started.md").read_text()
    script = (REPO / ".ci" / "install-paths").read_text().replace("pip install -q ", "pip install ")
    for command in PATHS:
        assert command in page.splitlines()
        assert f"    {command}" in script.splitlines()


def test_ci_runs_the_install_paths() -> None:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert ".ci/install-paths" in (line.strip() for line in lines)


def test_a_kafka_user_gets_pytest_asyncio_and_no_moto() -> None:
    """The extras per broker: ``testing`` is what the docs' Kafka project needs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[\[<>=]", requirement)[0] for requirement in extras["testing"]}
    assert {"pytest", "pytest-asyncio", "testcontainers"} <= names
    assert "moto" not in names
    assert any(requirement.startswith("moto[server]") for requirement in extras["testing-sqs"])
