"""Moved to :mod:`ackgate.testing._local`; kept so existing imports keep working."""

from ackgate.testing._local import (
    ServerDidNotStart,
    answers,
    free_port,
    local_server,
    log_tail,
)

__all__ = ["ServerDidNotStart", "answers", "free_port", "local_server", "log_tail"]
