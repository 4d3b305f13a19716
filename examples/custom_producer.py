"""Writing your own adapter: a producer that reads a directory of flag files.

Every ``inbox/<lane>/<name>.flag`` file is one event (its bytes are the raw event,
its path the broker payload). A handled file moves to ``done/``, a rejected one to
``rejected/`` (the dead-letter queue); a failed one stays in the inbox, so the next
scan delivers it again. Run it: ``python examples/custom_producer.py``.

The four things a producer decides:

* ``open_stream`` -- where events come from. The "connection" (here a lock file
  that makes this process the directory's only consumer) is opened here, lazily,
  and kept on ``self``: ackgate still calls ``advance`` after the generator ends.
* ``get_advance_lane`` -- which events must be advanced in order (here, one
  sub-directory is one lane). Called once per event; keep it O(1).
* ``advance`` -- what each outcome does to the broker. Raising ends the group.
* ``aclose`` -- release the connection; called once, after the last ``advance``.
"""

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Hashable, Sequence
from pathlib import Path
from typing import Any

from ackgate import AdvanceItem, SharedStreamManager, SharedStreamProducer


class FlagDirectoryProducer(SharedStreamProducer):
    def __init__(self, root: Path, poll_interval: float = 0.1) -> None:
        self._root = root
        self._poll_interval = poll_interval
        self._lock_fd: int | None = None
        # Files yielded but not advanced yet: a rescan must not deliver them twice.
        self._in_flight: set[Path] = set()

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self._lock_fd = await asyncio.to_thread(self._lock)
        while True:
            for path in await asyncio.to_thread(self._scan):
                if path not in self._in_flight:
                    self._in_flight.add(path)
                    yield await asyncio.to_thread(path.read_bytes), path
            # A directory cannot notify us portably, so the producer's own I/O loop
            # scans it now and then.
            await asyncio.sleep(self._poll_interval)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        path: Path = broker_payload
        return path.parent.name

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        await asyncio.to_thread(self._settle, batch)

    async def aclose(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            (self._root / ".lock").unlink()

    def _lock(self) -> int:
        # O_EXCL: a second consumer of the same directory fails loudly instead of
        # delivering every file twice.
        return os.open(self._root / ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY)

    def _scan(self) -> list[Path]:
        return sorted((self._root / "inbox").glob("*/*.flag"))

    def _settle(self, batch: Sequence[AdvanceItem]) -> None:
        for path, outcome in batch:
            self._in_flight.discard(path)
            if outcome.is_clean:
                target = "done"
            elif outcome.rejected and not outcome.failed:
                target = "rejected"
            else:
                continue  # failed, or nobody subscribed: left for the next scan
            destination = self._root / target / path.parent.name / path.name
            destination.parent.mkdir(parents=True, exist_ok=True)
            path.replace(destination)


async def ship(root: Path, expected: int) -> None:
    def producer() -> FlagDirectoryProducer:
        return FlagDirectoryProducer(root)

    # Leaving, the last subscriber stops the group: every resolved event is
    # advanced, then the producer is closed.
    async with (
        SharedStreamManager() as manager,
        manager.subscribe("inbox", "shipper", producer=producer) as events,
    ):
        for _ in range(expected):
            body = await anext(events)
            if not body.startswith(b"ship"):
                events.reject()
            print("handled", body)


def main() -> None:
    flags = {
        "eu/001": b"ship 3",
        "eu/002": b"garbled",
        "eu/003": b"ship 1",
        "us/001": b"ship 2",
        "us/002": b"ship 5",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, body in flags.items():
            path = root / "inbox" / f"{name}.flag"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        asyncio.run(ship(root, len(flags)))
        for folder in ("inbox", "done", "rejected"):
            names = sorted(str(p.relative_to(root / folder)) for p in root.glob(f"{folder}/*/*"))
            print(f"{folder}: {names}")


if __name__ == "__main__":
    main()
