import ackgate


def test_public_names_are_pinned() -> None:
    assert sorted(ackgate.__all__) == sorted(
        [
            "AckGateError",
            "AckTimeout",
            "AdvanceFailed",
            "AdvanceItem",
            "AdvanceOutcome",
            "AdvanceRun",
            "AuthenticationFailed",
            "BoundBatch",
            "BrokerLag",
            "DeliveryCounts",
            "EventBatch",
            "GroupStats",
            "HandlerStats",
            "IdRange",
            "Message",
            "DeadLetter",
            "OldestMessage",
            "OldestOutstanding",
            "PermanentError",
            "Redelivery",
            "Reject",
            "Retry",
            "Service",
            "ServiceStats",
            "SharedStreamManager",
            "SharedStreamProducer",
            "StreamTerminated",
            "SubscriberProgress",
            "Subscription",
            "SubscriberOverflow",
            "TLSVerificationFailed",
            "check_options",
            "masked_options",
            "reject_shared_stream_event",
        ]
    )
    for name in ackgate.__all__:
        assert getattr(ackgate, name).__module__ == "ackgate", name


def test_exception_hierarchy() -> None:
    for exc in (ackgate.AckTimeout, ackgate.SubscriberOverflow, ackgate.StreamTerminated):
        assert issubclass(exc, ackgate.AckGateError)
    assert issubclass(ackgate.AdvanceFailed, ackgate.StreamTerminated)
    for refusal in (ackgate.AuthenticationFailed, ackgate.TLSVerificationFailed):
        assert issubclass(refusal, ackgate.PermanentError)


def test_outcome_is_clean() -> None:
    assert ackgate.AdvanceOutcome(acked=2, failed=0, rejected=0).is_clean
    assert not ackgate.AdvanceOutcome(acked=2, failed=1, rejected=0).is_clean
    assert not ackgate.AdvanceOutcome(acked=2, failed=0, rejected=1).is_clean
    assert not ackgate.AdvanceOutcome(acked=0, failed=0, rejected=0).is_clean


def test_advance_item_is_a_named_tuple() -> None:
    outcome = ackgate.AdvanceOutcome(1, 0, 0)
    item = ackgate.AdvanceItem("payload", outcome)
    payload, got = item
    assert (payload, got) == ("payload", outcome)
    assert item.broker_payload == "payload" and item.outcome is outcome


def test_py_typed_is_shipped() -> None:
    from importlib.resources import files

    assert files("ackgate").joinpath("py.typed").is_file()
