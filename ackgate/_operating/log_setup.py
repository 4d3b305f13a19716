"""How ``ackgate run`` sets logging up: whose lines at which level, and no secret in any.

``--log-level`` is the level of ackgate's own loggers (``ackgate`` and its
children) and of the root logger (the services' own modules). The broker client
libraries' loggers (:data:`CLIENT_LOGGERS`) stay at INFO or above whatever
``--log-level`` says: at DEBUG they log what goes over the wire, which holds
credentials (aiokafka's ``SaslAuthenticateRequest(sasl_auth_bytes=b'alice\\x00alice\\x00
<the password>')``) and message keys and values. ``--client-log-level DEBUG`` asks
for those lines explicitly; a WARNING then says what they contain.

Whatever the levels, :class:`RedactFilter` on the root logger's handlers rewrites
the client libraries' lines: bytes literals (SASL exchanges, record keys and
values, produce requests) become their length, and ``password=...``-style
settings and ``SharedAccessKey=...`` lose their values. ackgate's own lines never
hold a body or a secret (docs/production.md#security), so they are left as they are.
"""

from __future__ import annotations

import ast
import logging
import re

from ackgate._operating.log_throttle import rate_limit_logging

logger = logging.getLogger("ackgate.run")

#: The broker clients' top-level loggers (and their HTTP/RPC transports).
CLIENT_LOGGERS = (
    "aiokafka",
    "kafka",
    "aiobotocore",
    "botocore",
    "boto3",
    "s3transfer",
    "urllib3",
    "aiohttp",
    "google",
    "grpc",
    "azure",
    "uamqp",
    "httpx",
    "httpcore",
)

#: The lowest level :data:`CLIENT_LOGGERS` get unless ``--client-log-level`` says otherwise.
SAFE_CLIENT_LEVEL = logging.INFO

_BYTES = re.compile(r"""b'(?:[^'\\]|\\.)*'|b"(?:[^"\\]|\\.)*\"""")
_SECRET_SETTING = re.compile(
    r"""((?:password|passwd|secret|token|sharedaccesskey|sharedaccesssignature|"""
    r"""signature|authorization|x-amz-security-token|credential)[a-z_-]*['"]?\s*[=:]\s*)"""
    r"""(b?'[^']*'|b?"[^"]*"|[^\s,;)}\]]+)""",
    re.IGNORECASE,
)


def _bytes_redacted(match: re.Match[str]) -> str:
    try:
        size = len(ast.literal_eval(match.group()))
    except (ValueError, SyntaxError):  # cut short by the library's own truncation
        return "<bytes redacted>"
    return f"<{size} bytes redacted>"


def redact(text: str) -> str:
    """``text`` without bytes literals' contents and without secret settings' values."""
    text = _BYTES.sub(_bytes_redacted, text)
    return _SECRET_SETTING.sub(lambda match: f"{match.group(1)}<redacted>", text)


class RedactFilter(logging.Filter):
    """Rewrite every record of a logger other than ackgate's with :func:`redact`.

    Attach it to a handler, before any other filter that formats the message.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.name
        if name == "ackgate" or name.startswith("ackgate."):
            return True
        text = record.getMessage()
        clean = redact(text)
        if clean != text:
            record.msg = clean
            record.args = None
        if record.exc_info is not None and record.exc_text is None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def configure_logging(level: str, client_level: str | None, *, worker: str | None) -> None:
    """Set up ``ackgate run``'s logging: ``level`` for ackgate and the services,
    ``client_level`` (default: ``level``, but never below INFO) for the broker clients,
    redaction and rate limiting on the root handler."""
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s "
        + ("" if worker is None else f"[worker {worker}] ")
        + "%(name)s: %(message)s",
    )
    wanted = logging.getLevelName(level)
    clients = (
        max(wanted, SAFE_CLIENT_LEVEL)
        if client_level is None
        else logging.getLevelName(client_level)
    )
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(clients)
    redaction = RedactFilter()
    for handler in logging.getLogger().handlers:
        handler.addFilter(redaction)
    rate_limit_logging(level=clients)
    if clients <= logging.DEBUG:
        logger.warning(
            "--client-log-level %s: the broker clients' wire-level lines are logged; they "
            "hold credentials exchanges and message keys and values (bytes are redacted "
            "from them, other fields may not be): do not ship these logs",
            logging.getLevelName(clients),
        )
