"""The four faults, each a coroutine run once the scenario's messages are flowing."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from scenario import HOSTS, Run


@dataclass(frozen=True)
class Durations:
    cut: float  # how long a host is cut off from the brokers
    broker_down: float  # how long the leader's broker stays down
    settle: float  # after a fault, before the next step of it


async def host_kill(run: Run, durations: Durations) -> None:
    """SIGKILL of every process of one host at once; it does not come back."""
    victim = HOSTS[0]
    run.fault(f"SIGKILL {victim}")
    killed = run.hosts[victim].kill()
    run.held()
    run.note(f"{victim}: {killed} processes SIGKILLed")
    await run.check_early()
    await asyncio.sleep(durations.settle)


async def host_cut(run: Run, durations: Durations) -> None:
    """One host's link to the bridge down for ``durations.cut``, then up again."""
    victim = HOSTS[0]
    run.fault(f"{victim} cut off")
    run.network.cut(victim)
    run.held()
    run.note(f"{victim} cut off from the brokers")
    back_at = asyncio.get_running_loop().time() + durations.cut
    await run.check_early()  # inside the cut: it takes seconds at the full size
    await asyncio.sleep(max(0.0, back_at - asyncio.get_running_loop().time()))
    run.fault(f"{victim} back")
    run.network.mend(victim)
    run.held()
    run.note(f"{victim} back on the network")
    took = await run.hosts[victim].ready(120)
    run.note(f"{victim} ready again {took:.1f}s after")
    await asyncio.sleep(durations.settle)


async def leader_kill(run: Run, durations: Durations) -> None:
    """SIGKILL of the broker leading partition 0; restarted after ``durations.broker_down``."""
    node = (await run.leaders())[0]
    broker = run.cluster.broker_of(node)
    run.fault(f"SIGKILL broker {broker} (leader of partition 0)")
    run.cluster.kill(broker)
    run.held()
    run.note(f"broker {broker} (node {node}, leader of partition 0) SIGKILLed")
    await run.check_early()
    await asyncio.sleep(durations.broker_down)
    run.cluster.start(broker)
    await run.cluster.ready(broker, 120)
    # From its return, not from the start command: a JVM's start is not the fault's cost.
    run.fault(f"broker {broker} answering again")
    run.held()
    run.note(f"broker {broker} answering again")
    moved = await run.leaders()
    run.note("leaders now " + ", ".join(f"p{p}:{n}" for p, n in sorted(moved.items())))
    await asyncio.sleep(durations.settle)


async def rolling_restart(run: Run, durations: Durations) -> None:
    """SIGTERM one host, wait for it to exit, start it again, wait until it is ready;
    then the next: the way an orchestrator replaces the replicas of a deployment."""
    for name in HOSTS:
        host = run.hosts[name]
        run.fault(f"SIGTERM {name}")
        status = await host.terminate()
        run.held()
        run.note(f"{name} exited {status}")
        if status != 0:
            raise RuntimeError(f"{name} exited {status} after SIGTERM; see {host.log}")
        await run.check_early()
        run.fault(f"{name} started again")
        host.start()
        took = await host.ready(120)
        run.held()
        run.note(f"{name} ready {took:.1f}s after its start")
        await asyncio.sleep(durations.settle)
