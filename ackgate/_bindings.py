"""Bindings: derived outputs tied to the raw event they were derived from.

A subscriber's part in an event resolves as ``acked`` only once its window on the
event is closed *and* every output it bound inside that window was confirmed
persisted. One :class:`Binding` exists per (subscriber, event) that bound at least
one output; the registry maps each sequence number to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ackgate._log import Event
    from ackgate._subscription import Subscription


class Binding:
    """Invariant: ``outstanding`` equals the number of this binding's sequence numbers
    still in the registry, until the binding is abandoned (``forget``)."""

    __slots__ = ("event", "extra_seqs", "first_seq", "outstanding", "subscriber", "window_open")

    def __init__(self, subscriber: Subscription, event: Event) -> None:
        self.subscriber = subscriber
        self.event = event
        self.outstanding = 0
        self.window_open = True
        self.first_seq = 0
        self.extra_seqs: list[int] | None = None  # rare: more than one output per event


class BindingRegistry:
    """Sequence numbers of one manager. Numbers are unique per manager and start at 1."""

    __slots__ = ("_by_seq", "_next_seq")

    def __init__(self) -> None:
        self._by_seq: dict[int, Binding] = {}
        self._next_seq = 1

    def bind(self, binding: Binding) -> int:
        seq = self._next_seq
        self._next_seq = seq + 1
        self._by_seq[seq] = binding
        if binding.outstanding == 0 and binding.extra_seqs is None:
            binding.first_seq = seq
        elif binding.extra_seqs is None:
            binding.extra_seqs = [seq]
        else:
            binding.extra_seqs.append(seq)
        binding.outstanding += 1
        return seq

    def confirm(self, seqs: Iterable[object]) -> None:
        """Mark outputs persisted. Anything that is not a live sequence number is ignored."""
        by_seq = self._by_seq
        for seq in seqs:
            if type(seq) is not int:  # bool, str, None, unhashables: never a sequence number
                continue
            binding = by_seq.pop(seq, None)
            if binding is None:
                continue
            binding.outstanding -= 1
            if binding.outstanding == 0 and not binding.window_open:
                binding.subscriber._binding_settled(binding)

    def forget(self, binding: Binding) -> None:
        """Drop a binding's unconfirmed numbers: its event resolved another way."""
        by_seq = self._by_seq
        by_seq.pop(binding.first_seq, None)
        if binding.extra_seqs is not None:
            for seq in binding.extra_seqs:
                by_seq.pop(seq, None)
        binding.outstanding = 0

    def __len__(self) -> int:
        return len(self._by_seq)
