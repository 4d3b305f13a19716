"""The version of the ``ackgate`` distribution; the wheel's metadata is read from here."""

__version__ = "0.1.0"
