"""Several hosts in one consumer group on a three-broker Kafka cluster, under faults.

    sudo python benchmarks/multihost [--quick] [--scenarios kill,cut,leader,rolling]

On one machine, with network namespaces (root and ``ip`` needed): a Kafka 4.1 KRaft
cluster of three brokers (one namespace each; replication factor 3,
``min.insync.replicas=2``) and three consumer hosts (one namespace each), each running
``ackgate run hostservice:service --workers 2`` of a three-handler service that records
every delivery durably. Per scenario, a fresh topic and consumer group; keyed messages
are produced at a steady rate and, a quarter of the way in, one fault:

* ``kill``: SIGKILL of every process of one host (it stays down);
* ``cut``: one host's link to the brokers down for 60 s (``--cut``), then back;
* ``leader``: the broker leading partition 0 SIGKILLed, restarted 30 s later;
* ``rolling``: SIGTERM of each host in turn, started again once it exited, the next
  one once it is ready.

Each scenario prints: lost and early (a committed offset no handler had recorded,
checked right after each fault and at the end), the order per key and the duplicates
per handler, and the time from each fault to every partition being consumed again (its
committed offset moving). The full size is 12 partitions and 100,000 messages;
``--quick`` is 6 partitions, 10,000 messages and shorter faults (CI runs it). Exits 1
on any lost, early or out-of-order message, or when the messages were not all
committed in the end.

Every namespace, link and process it made is removed on exit, failure and SIGTERM or
SIGINT included (after a SIGKILL of this script, its processes get SIGTERM from the
kernel and the next run removes its namespaces). Not part of the test run: CI runs
``--quick`` from ``.ci/run``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import faults
from cluster import BROKERS, Cluster
from network import Network
from scenario import HOSTS, Fault, Size, run_scenario

FULL = Size(
    messages=100_000,
    partitions=12,
    keys=1000,
    produce_seconds=150,
    fault_at=0.25,
    drain_timeout=300,
)
QUICK = Size(
    messages=10_000, partitions=6, keys=200, produce_seconds=30, fault_at=0.25, drain_timeout=90
)
FULL_DURATIONS = faults.Durations(cut=60, broker_down=30, settle=5)
QUICK_DURATIONS = faults.Durations(cut=10, broker_down=6, settle=2)
SCENARIOS = {
    "kill": faults.host_kill,
    "cut": faults.host_cut,
    "leader": faults.leader_kill,
    "rolling": faults.rolling_restart,
}


def report(figures: dict[str, object], size: Size) -> list[str]:
    lost, early = figures["lost"], figures["early"]
    order, duplicates = figures["order_violations"], figures["duplicates"]
    assert isinstance(lost, dict) and isinstance(early, dict)
    assert isinstance(order, dict) and isinstance(duplicates, dict)
    lines = [
        f"scenario {figures['scenario']}: {figures['produced']} messages produced, "
        f"{size.partitions} partitions, {len(HOSTS)} hosts x 2 workers, {len(BROKERS)} brokers",
        f"  all committed in the end: {'yes' if figures['complete'] else 'NO'}",
        f"  {'handler':9} {'lost':>5} {'early':>6} {'order':>6} {'duplicates':>18}",
    ]
    produced = max(1, int(str(figures["produced"])))
    for handler in lost:
        share = 100 * duplicates[handler] / produced
        lines.append(
            f"  {handler:9} {lost[handler]:5} {early[handler]:6} {order[handler]:6} "
            f"{duplicates[handler]:9} ({share:5.2f} %)"
        )
    lines.append(f"  early checked {figures['early_checks']} times (after each fault, at the end)")
    recoveries = figures["recoveries"]
    assert isinstance(recoveries, list)
    for what, took, at in recoveries:
        shown = took if isinstance(took, str) else f"{took:.1f} s"
        lines.append(f"  at {at:6.1f}s {what}: all partitions consumed again after {shown}")
    notes = figures["notes"]
    assert isinstance(notes, list)
    lines += [f"    {note}" for note in notes]
    lines.append(f"  wall {figures['seconds']} s")
    return lines


def failed(figures: dict[str, object]) -> bool:
    counts = [figures[k] for k in ("lost", "early", "order_violations")]
    return not figures["complete"] or any(isinstance(c, dict) and any(c.values()) for c in counts)


async def main_async(args: argparse.Namespace, workdir: Path) -> int:
    size = QUICK if args.quick else FULL
    if args.messages:
        size = Size(**{**size.__dict__, "messages": args.messages})
    durations = QUICK_DURATIONS if args.quick else FULL_DURATIONS
    if args.cut:
        durations = faults.Durations(args.cut, durations.broker_down, durations.settle)
    addresses = {b: i + 1 for i, b in enumerate(BROKERS)} | {h: i + 11 for i, h in enumerate(HOSTS)}
    status = 0
    started = time.monotonic()
    with Network(addresses) as network:
        cluster = Cluster(network, workdir)
        try:
            await cluster.start_all(within=180)
            print(
                f"cluster of {len(BROKERS)} brokers ready in {time.monotonic() - started:.1f} s",
                flush=True,
            )
            for name in args.scenarios:
                fault: Fault = functools.partial(SCENARIOS[name], durations=durations)
                began = time.monotonic()
                figures = await run_scenario(name, fault, size, network, cluster, workdir)
                figures["seconds"] = round(time.monotonic() - began, 1)
                if args.json:
                    print(json.dumps(figures), flush=True)
                else:
                    print("\n".join(report(figures, size)), flush=True)
                if failed(figures):
                    status = 1
        finally:
            cluster.stop_all()
    print(f"total wall {time.monotonic() - started:.1f} s", flush=True)
    return status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the bounded size CI runs")
    parser.add_argument(
        "--scenarios",
        type=lambda text: [s for s in text.split(",") if s],
        default=list(SCENARIOS),
        help="comma-separated subset of " + ",".join(SCENARIOS),
    )
    parser.add_argument("--messages", type=int, help="override the size's message count")
    parser.add_argument("--cut", type=float, help="seconds a host is cut off")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    parser.add_argument("--keep", help="keep the logs and records in this directory")
    args = parser.parse_args()
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    # The driver's own clients retry through the faults; their per-retry lines are noise.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        sys.exit("network namespaces need root and iproute2's ip")
    if args.keep:
        workdir = Path(args.keep)
        workdir.mkdir(parents=True, exist_ok=True)
        sys.exit(asyncio.run(main_async(args, workdir)))
    with tempfile.TemporaryDirectory(prefix="ackgate-multihost-") as tmp:
        status = asyncio.run(main_async(args, Path(tmp)))
    sys.exit(status)


if __name__ == "__main__":
    main()
