"""Moved to the public kit :mod:`ackgate.testing.conformance`; kept so existing imports
keep working."""

from ackgate.testing.conformance import *  # noqa: F403
from ackgate.testing.conformance import __all__  # noqa: F401
