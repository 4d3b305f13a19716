"""Broker adapters. Each lives in its own module, imports its SDK lazily and is
installed with an extra: ``pip install 'ackgate[kafka]'``, ``[sqs]``, ``[pubsub]``,
``[servicebus]``. The in-process :mod:`ackgate.adapters.memory` broker needs nothing.
"""
