"""The contract layer: what a broker adapter and a user program share with ackgate.

Errors, the ``Message`` a handler receives, the outcomes an adapter is told, the
:class:`~ackgate.SharedStreamProducer` base class, the upstream (broker connection)
signals and the statistics types. Standard library only; it imports nothing else of
ackgate, and every other layer may import it. See ``docs/internals.md``.
"""
