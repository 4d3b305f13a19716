"""Argument types shared by the ``ackgate`` subcommands: each turns a bad value into
argparse's one-line error (exit 2), never a traceback. The rules are the ones every layer
checks its arguments with (``ackgate._contract.checks``), so they read the same."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ackgate._contract.checks import check_int, check_number, int_rule, number_rule


class BadTarget(Exception):
    """A bad command line the parser could not catch: a ``MODULE:ATTR`` that does not name
    services, a port already in use. The message is the one line shown (exit 2)."""


def int_at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= minimum`` (and ``<= maximum`` if given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            return check_int("", value, minimum=minimum, maximum=maximum)
        except ValueError:
            rule = int_rule(minimum, maximum)
            raise argparse.ArgumentTypeError(f"must be {rule}, got {value}") from None

    return parse


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds ``>= 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_number("", value, minimum=0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {number_rule(0)}, got {text}") from None


#: An argparse ``type``: a TCP port number.
port = int_at_least(0, 65535)
