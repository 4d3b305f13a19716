"""The books of one scenario: what was produced, what each handler recorded, what the
cluster committed, and the checks made of them.

* **lost**: a produced message some handler never recorded.
* **early**: an offset below a committed offset that some handler had not recorded when
  the commit was read (the commit is read first, the records after it, so a record
  written before its commit is always seen).
* **order**: per handler and key, the first delivery of each message comes in the key's
  order (the first delivery of ``seq`` comes after the first of ``seq - 1``). Records
  of all hosts are merged by time (one machine, one clock). A redelivery after a fault
  goes back in the key, which is a duplicate, not disorder.
* **duplicates**: deliveries past the first, per handler.
* **recovery**: from a fault, the time until every partition that still had messages
  to consume has its committed offset advanced past where it was once the fault took
  hold (the first poll after the host was killed, cut off or had exited, the broker was
  killed): an advance after that moment is a live consumer's, not the last commits of
  the one that went away.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HANDLERS = ("indexer", "auditor", "notifier")  # hostservice's


@dataclass(frozen=True)
class Produced:
    key: str
    seq: int
    partition: int
    offset: int


@dataclass
class Records:
    """Every line of every host's record files, read at one moment."""

    #: handler -> (partition, offset) -> deliveries
    deliveries: dict[str, Counter[tuple[int, int]]]
    #: handler -> key -> [(time_ns, seq)] in file order
    by_key: dict[str, dict[str, list[tuple[int, int]]]]

    @classmethod
    def read(cls, directory: Path) -> Records:
        deliveries: dict[str, Counter[tuple[int, int]]] = {h: Counter() for h in HANDLERS}
        by_key: dict[str, dict[str, list[tuple[int, int]]]] = {
            h: defaultdict(list) for h in HANDLERS
        }
        for path in sorted(directory.glob("*.log")):
            for line in path.read_text().splitlines():
                fields = line.split()
                if len(fields) != 6:  # a torn last line of a killed process: never here
                    raise ValueError(f"{path.name}: malformed record {line!r}")
                handler, partition, offset, key, seq, stamp = fields
                deliveries[handler][int(partition), int(offset)] += 1
                by_key[handler][key].append((int(stamp), int(seq)))
        return cls(deliveries, by_key)

    def missing(self, positions: set[tuple[int, int]]) -> dict[str, int]:
        """Per handler, how many of ``positions`` it never recorded."""
        return {h: len(positions - self.deliveries[h].keys()) for h in HANDLERS}

    def duplicates(self) -> dict[str, int]:
        return {h: sum(c.values()) - len(c) for h, c in self.deliveries.items()}

    def order_violations(self) -> dict[str, int]:
        """Per handler, first deliveries that skipped ahead of their key's next message."""
        violations = {}
        for handler, keys in self.by_key.items():
            count = 0
            for stamps in keys.values():
                seen = -1
                for _stamp, seq in sorted(stamps):
                    if seq <= seen:
                        continue  # a redelivery
                    if seq != seen + 1:
                        count += 1
                    seen = max(seen, seq)
            violations[handler] = count
        return violations


def below(committed: dict[int, int]) -> set[tuple[int, int]]:
    return {(p, o) for p, c in committed.items() for o in range(c)}


@dataclass
class Timeline:
    """Committed offsets polled through the run, and the faults' moments."""

    polls: list[tuple[float, dict[int, int], dict[int, int]]] = field(default_factory=list)
    #: (what, when it began, when it took hold)
    faults: list[tuple[str, float, float]] = field(default_factory=list)

    def add(self, at: float, committed: dict[int, int], ends: dict[int, int]) -> None:
        self.polls.append((at, dict(committed), dict(ends)))

    def recovery(self, fault_at: float, held_at: float, ends: dict[int, int]) -> float | str:
        """Seconds from ``fault_at`` until every partition with messages left then
        (below ``ends``, the partitions' final ends) had committed past its offset at the
        first poll after ``held_at``; or why not."""
        after = [poll for poll in self.polls if poll[0] >= held_at]
        if not after:
            return "never (no poll after it)"
        baseline_at, at_fault, _ends = after[0]
        waiting = {p for p, end in ends.items() if at_fault.get(p, 0) < end}
        if not waiting:
            return "n/a (nothing left to consume)"
        for at, committed, _ends in after:
            if at <= baseline_at:
                continue
            waiting = {p for p in waiting if committed.get(p, 0) <= at_fault.get(p, 0)}
            if not waiting:
                return at - fault_at
        return f"never ({len(waiting)} partitions not consumed again)"
