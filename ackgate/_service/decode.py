"""``decode=``: a handler's typed payload, made from the body once per message and decoder.

A decoder is what the user passed: a callable ``bytes -> T``, a pydantic v2 model
class or a msgspec ``Struct`` class (both read JSON bodies). Neither library is
imported by ackgate unless such a class is given (the model was made with it, so it
is installed). :func:`check_decoder` turns the user's object into a
:class:`Decoder` at decoration; :meth:`Decoder.decoded` runs it at hand-out, caching
the value (or the error) on the shared :class:`~ackgate.Message`, so handlers that
share a decoder decode each message once. A decode error is a :class:`~ackgate.Reject`
for that handler, with a reason naming the error (docs/getting-started.md#typed-payloads).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from ackgate._contract.message import Message, Reject

#: Longest decode error text kept in a reject's reason (it reaches a dead-letter header).
_REASON_LIMIT = 500


class Decoder:
    """One user-given ``decode=`` object, ready to call on a body."""

    __slots__ = ("_call", "source")

    def __init__(self, source: object, call: Callable[[bytes], Any]) -> None:
        #: What the user passed: the cache key, so every handler given it shares values.
        self.source = source
        self._call = call

    def decoded(self, message: Message[Any]) -> Message[Any]:
        """A copy of ``message`` whose ``value`` is the decoded body; ``Reject`` (the
        reason names the error) when the body does not decode. Decodes at most once
        per message and :attr:`source`, whichever handler asks first."""
        cache: dict[object, object] | None = getattr(message, "_decoded", None)
        if cache is None:
            cache = {}
            object.__setattr__(message, "_decoded", cache)  # frozen: past its __setattr__
        try:
            result = cache[self.source]
        except KeyError:
            try:
                result = self._call(message.body)
            except Exception as error:  # the decoder's failure is the body's: a reject
                result = _reject(self.source, error)
            cache[self.source] = result
        if isinstance(result, Reject):
            raise result
        value: Any = result
        return dataclasses.replace(message, value=value)

    def __repr__(self) -> str:
        return f"Decoder({self.source!r})"


def check_decoder(owner: str, decode: object) -> Decoder | None:
    """``decode=`` as a :class:`Decoder` (``None``: none); ``TypeError`` naming ``owner``
    for anything that is neither a callable, a pydantic model nor a msgspec Struct."""
    if decode is None:
        return None
    if isinstance(decode, type):
        validate_json = getattr(decode, "model_validate_json", None)
        if validate_json is not None and hasattr(decode, "model_fields"):
            return Decoder(decode, validate_json)  # a pydantic v2 model
        if _is_msgspec_struct(decode):
            msgspec_json = importlib.import_module("msgspec.json")
            return Decoder(decode, msgspec_json.Decoder(decode).decode)
    if not callable(decode):
        raise TypeError(
            f"{owner}: decode must be a callable taking the body (bytes), a pydantic model "
            f"class or a msgspec Struct class, got {decode!r}"
        )
    return Decoder(decode, decode)


def _is_msgspec_struct(cls: type) -> bool:
    """Whether ``cls`` is a msgspec Struct, read from its metaclass, without importing
    msgspec for classes that are not."""
    return any(
        meta.__module__.startswith("msgspec") and meta.__name__ == "StructMeta"
        for meta in type.mro(type(cls))
    )


def _reject(source: object, error: Exception) -> Reject:
    name = getattr(source, "__qualname__", None) or type(source).__qualname__
    text = " ".join(str(error).split())
    if len(text) > _REASON_LIMIT:
        text = text[: _REASON_LIMIT - 3] + "..."
    return Reject(f"decode={name} failed: {type(error).__name__}: {text}")
