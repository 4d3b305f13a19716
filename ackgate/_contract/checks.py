"""Argument checks: one precise ``ValueError`` naming the argument, raised where it is given.

Every layer checks its arguments with these, so a rule reads the same everywhere
("concurrency must be an int >= 1, got 0"); the command line turns the same rules
into argparse errors (``ackgate._operating.args``).
"""

from __future__ import annotations

import math


def int_rule(minimum: int, maximum: int | None = None) -> str:
    """What :func:`check_int` asks for, as the error says it: ``"an int >= 1"``."""
    if maximum is None:
        return f"an int >= {minimum}"
    return f"an int within {minimum}..{maximum}"


def number_rule(minimum: float, *, inclusive: bool = True, finite: bool = True) -> str:
    """What :func:`check_number` asks for: ``"a finite number >= 0"``."""
    kind = "a finite number" if finite else "a number"
    return f"{kind} {'>=' if inclusive else '>'} {minimum:g}"


def check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) within the bounds, else ``ValueError``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        raise ValueError(f"{name} must be {int_rule(minimum, maximum)}, got {value!r}")
    return value


def check_number(
    name: str, value: object, *, minimum: float, inclusive: bool = True, finite: bool = True
) -> float:
    """``value`` as a ``float`` if it is a real number (not a ``bool``, not NaN; finite
    unless ``finite=False``) above ``minimum`` (or equal to it when ``inclusive``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or math.isnan(value)
        or (finite and math.isinf(value))
        or value < minimum
        or (value == minimum and not inclusive)
    ):
        rule = number_rule(minimum, inclusive=inclusive, finite=finite)
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return float(value)
