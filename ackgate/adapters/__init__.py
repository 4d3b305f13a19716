"""The in-process broker, :mod:`ackgate.adapters.memory`: ackgate's own adapter and test double.

Broker adapters are distributions of their own (``ackgate-kafka``, ``ackgate-sqs``,
``ackgate-pubsub``, ``ackgate-servicebus``; ``pip install 'ackgate[kafka]'`` and so on),
registered under the ``ackgate.adapters`` entry-point group: ``ackgate adapters`` lists
what is installed.
"""
