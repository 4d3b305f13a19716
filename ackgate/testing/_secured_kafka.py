"""A local Kafka broker with a SASL_SSL listener, as Confluent Cloud and MSK require:
TLS with a certificate signed by a CA made for the run, and SASL with SCRAM-SHA-512
and PLAIN for one user.

The PLAINTEXT listener of :class:`~ackgate.testing._local.LocalKafkaBroker` stays (the
readiness check and a test's own admin calls use it); clients under test connect to
:attr:`SecuredKafkaBroker.secure_bootstrap`. The CA and the broker's key are made with
the ``openssl`` command (Kafka reads them as a PEM keystore: no Java keystore), the
SCRAM user is created by ``kafka-storage format --add-scram`` (KRaft keeps SCRAM
credentials in its metadata log). A second, unrelated CA (:attr:`other_ca`) lets a test
present a trust store that does not sign the broker's certificate.
"""

from __future__ import annotations

import secrets
import shutil
import ssl
import subprocess
from pathlib import Path

from ackgate.testing._local import LocalKafkaBroker, ServerDidNotStart, free_port

#: The user the broker knows (SCRAM-SHA-512 and PLAIN).
USER = "alice"


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise ServerDidNotStart("a SASL_SSL Kafka broker needs the openssl command on PATH")
    done = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise ServerDidNotStart(f"openssl {' '.join(args[:2])} failed:\n{done.stderr}")


def make_ca(directory: Path, name: str) -> Path:
    """A self-signed CA under ``directory``: ``<name>.pem`` (its key next to it)."""
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
        cwd=directory,
    )  # fmt: skip
    return directory / f"{name}.pem"


def make_server_keystore(directory: Path, ca: str) -> Path:
    """A key and a certificate for 127.0.0.1 signed by CA ``ca``, in one PEM file (the
    key first, unencrypted PKCS#8: Kafka's ``ssl.keystore.type=PEM``)."""
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
        "-subj", "/CN=localhost", cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-out", "broker.pem", "-extfile", "san.ext",
        cwd=directory,
    )  # fmt: skip
    keystore = directory / "broker-keystore.pem"
    keystore.write_text(
        (directory / "broker.key").read_text() + (directory / "broker.pem").read_text()
    )
    return keystore


class SecuredKafkaBroker(LocalKafkaBroker):
    """:class:`LocalKafkaBroker` plus a ``SASL_SSL`` listener at :attr:`secure_bootstrap`
    (mechanisms ``SCRAM-SHA-512`` and ``PLAIN``, user :data:`USER`, password
    :attr:`password`, made fresh per broker so a test can look for it in logs)."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.secure_port = free_port()
        self.secure_bootstrap = f"127.0.0.1:{self.secure_port}"
        self.user = USER
        self.password = f"pw-{secrets.token_hex(8)}"
        tls = workdir / "tls"
        tls.mkdir(exist_ok=True)
        #: The CA that signed the broker's certificate, and one that did not.
        self.ca = make_ca(tls, "ackgate-test-ca")
        self.other_ca = make_ca(tls, "ackgate-other-ca")
        self._keystore = make_server_keystore(tls, "ackgate-test-ca")

    def ssl_context(self, cafile: Path | None = None) -> ssl.SSLContext:
        """A client context trusting ``cafile`` (default: the broker's own CA)."""
        return ssl.create_default_context(cafile=str(cafile or self.ca))

    def client_options(
        self, mechanism: str = "SCRAM-SHA-512", **overrides: object
    ) -> dict[str, object]:
        """aiokafka options for the secured listener (``bootstrap_servers`` included)."""
        options: dict[str, object] = {
            "bootstrap_servers": self.secure_bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": self.user,
            "sasl_plain_password": self.password,
            "ssl_context": self.ssl_context(),
        }
        options.update(overrides)
        return options

    def _format_options(self) -> list[str]:
        return ["--add-scram", f"SCRAM-SHA-512=[name={self.user},password={self.password}]"]

    def _settings(self) -> dict[str, str]:
        settings = super()._settings()
        listener = "listener.name.sasl_ssl"
        settings.update(
            {
                "listeners": f"{settings['listeners']},SASL_SSL://{self.secure_bootstrap}",
                "advertised.listeners": (
                    f"{settings['advertised.listeners']},SASL_SSL://{self.secure_bootstrap}"
                ),
                "listener.security.protocol.map": (
                    f"{settings['listener.security.protocol.map']},SASL_SSL:SASL_SSL"
                ),
                "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
                f"{listener}.ssl.keystore.type": "PEM",
                f"{listener}.ssl.keystore.location": str(self._keystore),
                f"{listener}.plain.sasl.jaas.config": (
                    "org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'user_{self.user}="{self.password}";'
                ),
                f"{listener}.scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
            }
        )
        return settings
