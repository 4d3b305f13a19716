"""The operating layer: the ``ackgate`` command and what runs a service in production.

``ackgate run`` (signals, exit codes, log throttling), its health and metrics
endpoints, ``--workers`` processes and ``ackgate demo``. Nothing below imports it.
See ``docs/internals.md``.
"""
