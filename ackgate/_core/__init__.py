"""The core engine: one shared stream per key, fanned out to its subscribers.

The manager, the group (its poll, fan-out log, membership, ack timeouts and the
resolution of every subscriber's part), the subscriptions and the lane tracker that
hands resolved events back to the producer in order. It imports only the contract
layer; the service layer above uses its public API. See ``docs/internals.md``.
"""
