"""SPEC §15: handler mistakes are never silent. A handler used without parentheses, with
a signature that cannot take a message, returning a value, raising CancelledError,
KeyboardInterrupt or SystemExit: each is refused or handled without losing a message,
and the error names the handler and the mistake."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

import pytest

from ackgate import AdvanceOutcome, Message, Reject, Retry, Service
from ackgate.testing import ScriptedProducer


def make() -> ScriptedProducer:
    return ScriptedProducer()


def outcomes(producer: ScriptedProducer) -> dict[Any, AdvanceOutcome]:
    return {item.broker_payload: item.outcome for batch in producer.batches for item in batch}


# -- at decoration ---------------------------------------------------------------------


def test_handler_without_parentheses_is_refused_naming_the_fix() -> None:
    service = Service("k", producer=make)

    with pytest.raises(TypeError, match=r"write @service.handler\('index'\) above"):

        @service.handler  # type: ignore[arg-type]
        async def index(message: Message) -> None:
            pass

    assert service.stats().handlers == {}


async def _none() -> None:
    pass


async def _two(message: Message, context: object) -> None:
    pass


async def _keyword_only(*, message: Message) -> None:
    pass


async def _three(a: int, b: int, message: Message) -> None:
    pass


class _NoArgument:
    async def __call__(self) -> None:
        pass


@pytest.mark.parametrize(
    ("function", "shown"),
    [
        (_none, r"_none\(\)"),
        (_two, r"_two\(message, context\)"),
        (_keyword_only, r"_keyword_only\(\*, message\)"),
        (_NoArgument(), r"_NoArgument\(\)"),
        (functools.partial(_two, None, None), r"functools.partial\(_two\)\(\)"),
    ],
)
def test_a_signature_that_cannot_take_one_message_is_refused(function: Any, shown: str) -> None:
    service = Service("k", producer=make)
    with pytest.raises(TypeError, match=rf"handler 'h': {shown} cannot be called with one Message"):
        service.handler("h")(function)
    with pytest.raises(TypeError, match="with a list of Message"):
        service.handler("batch", batch_size=10)(function)
    assert service.stats().handlers == {}


def test_signatures_that_take_one_message_are_accepted() -> None:
    service = Service("k", producer=make)

    async def star_args(*messages: Message) -> None:
        pass

    async def with_default(message: Message, context: object = None) -> None:
        pass

    class Handlers:
        async def method(self, message: Message) -> None:
            pass

        async def __call__(self, message: Message) -> None:
            pass

    for n, function in enumerate(
        [star_args, with_default, Handlers().method, Handlers(), functools.partial(_three, 1, 2)]
    ):
        service.handler(f"h{n}")(function)
    service.handler("batch", batch_size=10)(with_default)
    assert len(service.stats().handlers) == 6


@pytest.mark.parametrize(
    ("key", "match"),
    [
        ("", "must not be empty or blank"),
        ("  ", "must not be empty or blank"),
        (b"", "must not be empty or blank"),
        ("orders\n", "must be printable"),
    ],
)
def test_a_key_that_names_nothing_is_refused(key: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Service(key, producer=make)
