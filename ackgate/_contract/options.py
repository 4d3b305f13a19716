"""Helpers for adapter authors: options passed through to a client library are
checked when the producer is built, and never shown with their secrets.

Both are public (``ackgate.check_options``, ``ackgate.masked_options``) so that a
third-party adapter refuses a misspelt option and writes its ``repr`` exactly as
ackgate's own adapters do (docs/writing-an-adapter.md#1-the-producer).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: Option names whose values are secrets, or objects that may hold one: a match
#: anywhere in the name (``sasl_plain_password``, ``aws_secret_access_key``,
#: ``sasl_oauth_token_provider``, ``connection_string``, ``credentials``...).
_SECRET_NAME = re.compile(
    r"password|passwd|secret|token|credential|connection_string|private_key|access_key|"
    r"api_key|sas_key|shared_access",
    re.IGNORECASE,
)

MASK = "***"


def is_secret_option(name: str) -> bool:
    """Whether an option called ``name`` holds (or may hold) a secret."""
    return _SECRET_NAME.search(name) is not None


def masked_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every secret value (:func:`is_secret_option`) replaced by
    ``"***"``; the rest as they are. For ``__repr__`` and log lines."""
    return {
        name: MASK if value is not None and is_secret_option(name) else value
        for name, value in options.items()
    }


def check_options(
    options: Iterable[str], accepted: Callable[..., Any] | Iterable[str], *, what: str
) -> None:
    """Refuse an option name ``accepted`` does not take: ``TypeError`` naming it and the
    closest valid name.

    ``accepted`` is the callable the options go to (its keyword parameters are
    read with :func:`inspect.signature`; one taking ``**kwargs`` accepts anything)
    or the names themselves. ``what`` names it in the message
    (``"aiokafka.AIOKafkaConsumer"``). Call it from the producer's ``__init__``, so a
    misspelt ``sasl_plain_pasword=`` is a configuration error at once instead of a
    ``TypeError`` inside every restart of the stream.
    """
    if callable(accepted):
        parameters = inspect.signature(accepted).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return
        valid = [
            p.name
            for p in parameters
            if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    else:
        valid = list(accepted)
    unknown = [name for name in options if name not in valid]
    if not unknown:
        return
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1)
        problems.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(
        f"unknown {what} option{'s' if len(unknown) > 1 else ''}: {', '.join(problems)}"
    )
