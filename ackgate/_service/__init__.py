"""The service layer: decorated handlers run over one shared stream, kept up.

``Service`` and its handlers' calls (concurrency, ordering, retry, give-up), the
conversion of events to ``Message`` s and the handlers' telemetry. It uses the core
through the manager's public API and imports nothing of the operating layer. See
``docs/internals.md``.
"""
