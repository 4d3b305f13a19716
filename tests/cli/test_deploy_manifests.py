"""The deployment manifests of examples/deploy/ (shown in docs/deploying.md) agree with
``ackgate run``'s own command line: every command they run parses with its parser,
the probes ask the paths its health server answers on the port it is told to serve,
and every grace period is longer than the shutdown timeout it is given."""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ackgate._operating.cli import _parser

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"


def run_options(argv: list[str]) -> argparse.Namespace:
    """``argv`` (``ackgate run ...``) parsed by ackgate's own parser; a flag it does not
    know fails the test with argparse's message."""
    assert argv[:2] == ["ackgate", "run"], argv
    try:
        return _parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"ackgate's parser refuses {shlex.join(argv)} (its error is above)")


def manifest(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((DEPLOY / name).read_text())
    assert isinstance(document, dict)
    return document


def container() -> dict[str, Any]:
    (only,) = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def test_the_deployment_runs_a_command_ackgate_run_accepts() -> None:
    opts = run_options([*container()["command"], *container()["args"]])
    assert opts.health_port == 8080
    assert opts.workers == 2


def test_the_probes_ask_livez_and_readyz_on_the_health_port() -> None:
    spec = container()
    opts = run_options([*spec["command"], *spec["args"]])
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    paths = {}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = spec[probe]["httpGet"]
        assert ports.get(get["port"], get["port"]) == opts.health_port, probe
        paths[probe] = get["path"]
    assert paths == {
        "livenessProbe": "/livez",
        "readinessProbe": "/readyz",
        "startupProbe": "/livez",
    }
    # Each worker serves its metrics on --metrics-port + its index.
    metrics = {opts.metrics_port + i for i in range(opts.workers)}
    assert metrics <= set(ports.values())


def test_the_pod_gets_longer_than_the_shutdown_timeout_to_stop() -> None:
    spec = manifest("deployment.yaml")["spec"]["template"]["spec"]
    opts = run_options([*container()["command"], *container()["args"]])
    assert spec["terminationGracePeriodSeconds"] > opts.shutdown_timeout


def test_the_budget_and_the_autoscaler_aim_at_the_deployment() -> None:
    deployment = manifest("deployment.yaml")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    budget = manifest("pdb.yaml")
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    scaled = manifest("keda-scaledobject.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    env = {item["name"]: item["value"] for item in container()["env"]}
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == env["ACKGATE_KAFKA_GROUP"]
    assert trigger["metadata"]["topic"] == env["ACKGATE_KAFKA_TOPIC"]
    assert trigger["metadata"]["bootstrapServers"] == env["ACKGATE_KAFKA_BOOTSTRAP"]


def test_the_systemd_unit_runs_ackgate_run_and_waits_longer_than_its_shutdown() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string((DEPLOY / "ackgate.service").read_text())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "ackgate"
    opts = run_options(["ackgate", *argv[1:]])
    assert opts.health_port is not None
    assert float(service["TimeoutStopSec"]) > opts.shutdown_timeout
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"  # the parent forwards SIGTERM to its workers
    assert "2" in service["RestartPreventExitStatus"].split()  # a bad command line


def test_the_image_runs_ackgate_run_and_exposes_its_ports() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()

    def instruction(name: str) -> str:
        (found,) = re.findall(rf"^{name} (.+)$", dockerfile, re.MULTILINE)
        return str(found)

    argv = json.loads(instruction("ENTRYPOINT")) + json.loads(instruction("CMD"))
    opts = run_options(argv)
    exposed = {int(port) for port in instruction("EXPOSE").split()}
    assert {opts.health_port, opts.metrics_port} <= exposed
    assert instruction("STOPSIGNAL") == "SIGTERM"
    # The Deployment runs what the image runs, with its own options.
    assert container()["command"] == json.loads(instruction("ENTRYPOINT"))
