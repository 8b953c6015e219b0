"""TLS, SASL and secrets settings: what each client is given, where secrets come from, and who gets them.

Pure: certificates are generated into tmp_path by the stack's own generator (stack/certificates.py); no server runs.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr, ValidationError
from pydantic_settings import SettingsError

from infra.cassandra import ssl_context
from infra.errors import StackError
from infra.service_settings import KafkaSettings
from infra.settings import Settings, get_settings
from infra.settings_env import secret_vars
from infra.spark import kafka_options, pkcs8_pem
from stack.airflow.service import Airflow
from stack.certificates import StackTls, ensure_stack_tls
from stack.process import child_env
from stack.services.cassandra import Cassandra
from stack.services.kafka import Kafka
from stack.services.pipeline import ApiService, SpeedService

KAFKA_PW = "kafka-secret-0123456789"
CASSANDRA_PW = "cassandra-secret-0123456789"
ADMIN_PW = "airflow-admin-0123456789"
TOKEN = "api-token-0123456789abcdef"  # noqa: S105


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> StackTls:
    return ensure_stack_tls(tmp_path_factory.mktemp("tls"), ["127.0.0.1", "kafka.internal"])


@pytest.fixture(autouse=True)
def _no_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("TRENDS_"):
            monkeypatch.delenv(key)


def sasl_ssl(certs: StackTls, **extra: object) -> KafkaSettings:
    values: dict[str, object] = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "trends",
        "sasl_password": SecretStr(KAFKA_PW),
        "ssl_ca_file": certs.ca,
        **extra,
    }
    return KafkaSettings.model_validate(values)


# -- Kafka: librdkafka and Spark ---------------------------------------------------------------------------------
def test_sasl_ssl_client_config(certs: StackTls) -> None:
    conf = sasl_ssl(certs).client_config()
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "trends" and conf["sasl.password"] == KAFKA_PW
    assert conf["ssl.ca.location"] == str(certs.ca)
    assert conf["ssl.endpoint.identification.algorithm"] == "https"  # hostname check on by default
    assert "ssl.certificate.location" not in conf and "ssl.key.location" not in conf
    masked = sasl_ssl(certs).client_config(reveal_secrets=False)
    assert KAFKA_PW not in json.dumps(masked)


def test_mtls_client_config_and_hostname_check_off(certs: StackTls) -> None:
    kafka = KafkaSettings(
        security_protocol="SSL",
        ssl_ca_file=certs.ca,
        ssl_certificate_file=certs.client_cert,
        ssl_key_file=certs.client_key,
        ssl_key_password=SecretStr("kp"),
        ssl_check_hostname=False,
    )
    conf = kafka.client_config()
    assert conf["ssl.certificate.location"] == str(certs.client_cert)
    assert conf["ssl.key.location"] == str(certs.client_key)
    assert conf["ssl.key.password"] == "kp"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert "sasl.mechanism" not in conf


def test_plaintext_client_config_has_no_tls_keys() -> None:
    conf = KafkaSettings().client_config()
    assert not [k for k in conf if k.startswith(("ssl.", "sasl."))]
    assert not [k for k in kafka_options(KafkaSettings()) if "ssl" in k or "sasl" in k]


def test_spark_options_carry_pem_inline(certs: StackTls) -> None:
    opts = kafka_options(sasl_ssl(certs, ssl_certificate_file=certs.client_cert, ssl_key_file=certs.client_key))
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == (
        f'org.apache.kafka.common.security.scram.ScramLoginModule required username="trends" password="{KAFKA_PW}";'
    )
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert opts["kafka.ssl.truststore.certificates"] == certs.ca.read_text()
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert opts["kafka.ssl.keystore.certificate.chain"] == certs.client_cert.read_text()
    assert opts["kafka.ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert opts["kafka.ssl.endpoint.identification.algorithm"] == "https"
    plain = kafka_options(sasl_ssl(certs, sasl_mechanism="PLAIN"))
    assert plain["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    assert kafka_options(sasl_ssl(certs, ssl_check_hostname=False))["kafka.ssl.endpoint.identification.algorithm"] == ""


def test_pkcs1_key_is_converted_to_pkcs8_for_java(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pkcs1 = tmp_path / "key.pem"
    pkcs1.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    assert pkcs1.read_text().startswith("-----BEGIN RSA PRIVATE KEY-----")
    text = pkcs8_pem(pkcs1, None)
    assert text.startswith("-----BEGIN PRIVATE KEY-----")
    again = serialization.load_pem_private_key(text.encode(), password=None)
    assert again.private_numbers() == key.private_numbers()  # type: ignore[union-attr]
    encrypted = tmp_path / "enc.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    out = pkcs8_pem(encrypted, SecretStr("pw"))
    assert out.startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    with pytest.raises(ValueError, match="password opens"):
        pkcs8_pem(encrypted, SecretStr("wrong"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "SASL_PASSWORD"),
        ({"security_protocol": "SASL_SSL", "sasl_username": "u", "sasl_password": "p"}, "SASL_MECHANISM"),
        ({"security_protocol": "SSL", "ssl_certificate_file": "/c.pem"}, "SSL_KEY_FILE"),
        ({"sasl_mechanism": "GSSAPI"}, "SCRAM-SHA-512"),
    ],
)
def test_inconsistent_kafka_security_is_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(kafka=values)


# -- Cassandra ---------------------------------------------------------------------------------------------------
def test_cassandra_ssl_context(certs: StackTls) -> None:
    assert ssl_context(Settings().cassandra) is None
    cfg = Settings(cassandra={"ssl": True, "ssl_ca_file": str(certs.ca)}).cassandra
    ctx = ssl_context(cfg)
    assert ctx is not None
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.cert_store_stats()["x509_ca"] == 1  # exactly the configured CA, not the system's
    off = Settings(cassandra={"ssl": True, "ssl_ca_file": str(certs.ca), "ssl_check_hostname": False}).cassandra
    assert not ssl_context(off).check_hostname  # type: ignore[union-attr]
    mtls = Settings(
        cassandra={
            "ssl": True,
            "ssl_ca_file": str(certs.ca),
            "ssl_certificate_file": str(certs.client_cert),
            "ssl_key_file": str(certs.client_key),
        }
    ).cassandra
    assert ssl_context(mtls) is not None
    wrong = Settings(
        cassandra={"ssl": True, "ssl_certificate_file": str(certs.ca), "ssl_key_file": str(certs.ca)}
    ).cassandra
    with pytest.raises(ssl.SSLError):
        ssl_context(wrong)
    with pytest.raises(ValidationError, match="SSL_KEY_FILE"):
        Settings(cassandra={"ssl": True, "ssl_certificate_file": str(certs.client_cert)})


def test_make_cluster_gets_the_ssl_context(certs: StackTls) -> None:
    from infra.cassandra import make_cluster

    cluster = make_cluster(Settings(cassandra={"ssl": True, "ssl_ca_file": str(certs.ca), "username": "u"}))
    assert isinstance(cluster.ssl_context, ssl.SSLContext) and cluster.ssl_context.check_hostname
    assert make_cluster(Settings()).ssl_context is None


def test_stack_tls_points_clients_at_its_ca(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, stack={"tls": True})
    assert settings.kafka.ssl_ca_file == tmp_path / "tls" / "ca.pem"
    assert settings.cassandra.ssl and settings.cassandra.ssl_ca_file == tmp_path / "tls" / "ca.pem"
    explicit = Settings(data_dir=tmp_path, stack={"tls": True}, cassandra={"ssl": False}, kafka={"ssl_ca_file": "/x"})
    assert not explicit.cassandra.ssl and explicit.kafka.ssl_ca_file == Path("/x")
    assert Settings(data_dir=tmp_path).kafka.ssl_ca_file is None and not Settings(data_dir=tmp_path).cassandra.ssl


# -- the stack's certificates and server configs -----------------------------------------------------------------
def test_generated_certificates(tmp_path: Path) -> None:
    files = ensure_stack_tls(tmp_path / "tls", ["127.0.0.21", "127.0.0.22"])
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    chain = x509.load_pem_x509_certificates(files.server_cert.read_bytes())
    chain[0].verify_directly_issued_by(ca)
    san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(v) for v in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "127.0.0.21", "127.0.0.22"}
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    x509.load_pem_x509_certificate(files.client_cert.read_bytes()).verify_directly_issued_by(ca)
    for private in (files.ca_key, files.server_key, files.server_keystore, files.client_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    keystore = files.server_keystore.read_text()
    assert keystore.startswith("-----BEGIN PRIVATE KEY-----") and keystore.count("BEGIN CERTIFICATE") == 2
    # Python's own TLS accepts the pair (what a server-side context loads).
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.server_cert, files.server_key)
    # Kept across starts; a new address gets a new server certificate from the same CA.
    before = files.server_cert.read_bytes()
    assert ensure_stack_tls(tmp_path / "tls", ["127.0.0.22", "127.0.0.21"]).server_cert.read_bytes() == before
    again = ensure_stack_tls(tmp_path / "tls", ["127.0.0.23"])
    assert again.server_cert.read_bytes() != before
    assert x509.load_pem_x509_certificate(again.ca.read_bytes()) == ca


def tls_stack_settings(tmp_path: Path, **kafka: object) -> Settings:
    return Settings(
        data_dir=tmp_path,
        stack={"tls": True},
        kafka={
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "trends",
            "sasl_password": KAFKA_PW,
            **kafka,
        },
        cassandra={"username": "trends", "password": CASSANDRA_PW},
    )


def test_kafka_tls_listeners_and_scram_user(tmp_path: Path) -> None:
    kafka = Kafka(tls_stack_settings(tmp_path))
    kafka.check_safe()
    lines = kafka.listener_config().splitlines()
    assert "listeners=SASL_SSL://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093" in lines
    assert "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL" in lines
    assert f"ssl.keystore.location={tmp_path / 'tls' / 'server-keystore.pem'}" in lines
    assert "ssl.keystore.type=PEM" in lines and "ssl.truststore.type=PEM" in lines
    assert "sasl.enabled.mechanisms=SCRAM-SHA-512" in lines
    assert "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512" in lines
    jaas = next(line for line in lines if line.startswith("listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="))
    assert "ScramLoginModule" in jaas and f'password="{KAFKA_PW}"' in jaas
    assert kafka.scram_arguments() == ["--add-scram", f"SCRAM-SHA-512=[name=trends,password={KAFKA_PW}]"]
    ssl_only = Kafka(tls_stack_settings(tmp_path, security_protocol="SSL"))
    assert "ssl.client.auth=required" in ssl_only.listener_config().splitlines()
    assert "ssl.client.auth=none" in lines
    # The stack's SSL clients authenticate with the stack's client certificate.
    assert ssl_only.settings.kafka.ssl_certificate_file == tmp_path / "tls" / "client.pem"
    assert "ssl.certificate.location" in ssl_only.settings.kafka.client_config()
    assert ssl_only.scram_arguments() == []


@pytest.mark.parametrize(
    ("kafka", "message"),
    [
        ({"security_protocol": "PLAINTEXT"}, "SSL or SASL_SSL"),
        ({"sasl_password": 'has"quote-0123456789'}, "must not contain"),
        ({"sasl_password": "has,comma-0123456789"}, "must not contain"),
    ],
)
def test_kafka_tls_stack_refuses(tmp_path: Path, kafka: dict[str, str], message: str) -> None:
    with pytest.raises(StackError, match=message):
        Kafka(tls_stack_settings(tmp_path, **kafka)).check_safe()
    with pytest.raises(StackError, match="TRENDS_STACK__TLS=true"):
        Kafka(Settings(data_dir=tmp_path, kafka={"security_protocol": "SSL"})).check_safe()


def test_kafka_tls_stack_off_loopback_needs_a_long_password(tmp_path: Path) -> None:
    off = tls_stack_settings(tmp_path, bootstrap_servers="10.9.8.7:9092", sasl_password="short-pw")  # noqa: S106
    with pytest.raises(StackError, match=r"not a loopback address.*at least 16"):
        Kafka(off).check_safe()
    Kafka(tls_stack_settings(tmp_path, bootstrap_servers="10.9.8.7:9092")).check_safe()  # 23 characters: fine


def test_cassandra_client_encryption(tmp_path: Path) -> None:
    settings = tls_stack_settings(tmp_path)
    node = Cassandra(settings)
    node.check_safe()
    node.conf_dir.mkdir(parents=True)
    text = node.render_config().read_text()
    assert "client_encryption_options:\n  enabled: true\n  optional: false" in text
    assert "org.apache.cassandra.security.PEMBasedSslContextFactory" in text
    assert f"keystore: {tmp_path / 'tls' / 'server-keystore.pem'}" in text
    assert "authenticator: PasswordAuthenticator" in text
    plain = Cassandra(Settings(data_dir=tmp_path / "plain"))
    plain.conf_dir.mkdir(parents=True)
    assert "client_encryption_options" not in plain.render_config().read_text()
    no_password = Settings(data_dir=tmp_path, stack={"tls": True})
    with pytest.raises(StackError, match="TRENDS_CASSANDRA__USERNAME"):
        Cassandra(no_password).check_safe()


# -- secrets from files, and who gets them -----------------------------------------------------------------------
def secrets_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "TRENDS_KAFKA__SASL_PASSWORD").write_text(KAFKA_PW)
    (folder / "TRENDS_CASSANDRA__PASSWORD").write_text(CASSANDRA_PW + "\n")  # a trailing newline, as editors leave
    (folder / "trends_airflow__admin_password").write_text(ADMIN_PW)  # names are case-insensitive, like the env
    (folder / "TRENDS_SERVING__API_TOKEN").write_text(TOKEN)
    return folder


def test_secrets_are_read_from_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_SECRETS_DIR", str(secrets_folder(tmp_path)))
    monkeypatch.setenv("TRENDS_KAFKA__SASL_USERNAME", "trends")
    settings = Settings()
    assert settings.kafka.sasl_password is not None
    assert settings.kafka.sasl_password.get_secret_value() == KAFKA_PW
    assert settings.kafka.sasl_username == "trends"  # env and files merge within a section
    assert settings.cassandra.password is not None
    assert settings.cassandra.password.get_secret_value() == CASSANDRA_PW
    assert settings.airflow.admin_password.get_secret_value() == ADMIN_PW
    assert settings.secrets_dir == tmp_path / "secrets"
    monkeypatch.setenv("TRENDS_KAFKA__SASL_PASSWORD", "from-the-env")
    assert Settings().kafka.sasl_password.get_secret_value() == "from-the-env"  # type: ignore[union-attr]


def test_a_missing_secrets_folder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_SECRETS_DIR", str(tmp_path / "nope"))
    with pytest.raises(SettingsError, match="does not exist"):
        Settings()


def test_trends_config_never_shows_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.cli import cli

    monkeypatch.setenv("TRENDS_SECRETS_DIR", str(secrets_folder(tmp_path)))
    monkeypatch.setenv("TRENDS_KAFKA__SSL_KEY_PASSWORD", "key-password-0123456789")
    get_settings.cache_clear()  # the command reads the process-wide settings: read them from this environment
    try:
        result = CliRunner().invoke(cli, ["config"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["kafka"]["sasl_password"] == "**********"  # noqa: S105
    for secret in (KAFKA_PW, CASSANDRA_PW, ADMIN_PW, TOKEN, "key-password-0123456789"):
        assert secret not in result.output


def all_secrets(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        kafka={"sasl_password": KAFKA_PW, "ssl_key_password": "kafka-key-pw-0123456789"},
        cassandra={"username": "trends", "password": CASSANDRA_PW},
        airflow={"admin_password": ADMIN_PW},
        serving={"api_token": TOKEN},
    )


def test_child_env_holds_no_secret_and_only_its_services_files(tmp_path: Path) -> None:
    settings = all_secrets(tmp_path)
    parent = {"PATH": "/usr/bin", "TRENDS_SERVING__API_TOKEN": TOKEN, "trends_airflow__admin_password": ADMIN_PW}
    env = child_env(settings, ("kafka", "cassandra"), tmp_path / "speed-secrets", base=parent)
    joined = "\n".join(f"{k}={v}" for k, v in env.items())
    for secret in (KAFKA_PW, CASSANDRA_PW, ADMIN_PW, TOKEN, "kafka-key-pw-0123456789"):
        assert secret not in joined  # neither from the settings nor inherited from the parent
    assert env["PATH"] == "/usr/bin" and env["TRENDS_CASSANDRA__USERNAME"] == "trends"
    folder = Path(env["TRENDS_SECRETS_DIR"])
    assert sorted(p.name for p in folder.iterdir()) == [
        "TRENDS_CASSANDRA__PASSWORD",
        "TRENDS_KAFKA__SASL_PASSWORD",
        "TRENDS_KAFKA__SSL_KEY_PASSWORD",
    ]
    assert (folder / "TRENDS_KAFKA__SASL_PASSWORD").read_text() == KAFKA_PW
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    # What the child reads back: the same settings, its secrets included, nothing else's.
    child = Settings(_secrets_dir=folder)
    assert child.kafka.sasl_password.get_secret_value() == KAFKA_PW  # type: ignore[union-attr]
    assert child.serving.api_token is None
    # A narrower child reusing the folder loses what it no longer needs.
    child_env(settings, ("serving",), folder, base=parent)
    assert [p.name for p in folder.iterdir()] == ["TRENDS_SERVING__API_TOKEN"]


def test_stack_children_get_their_services_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = all_secrets(tmp_path)
    monkeypatch.setenv("TRENDS_AIRFLOW__ADMIN_PASSWORD", ADMIN_PW)  # in our own environment: not passed on
    kafka = {"TRENDS_KAFKA__SASL_PASSWORD", "TRENDS_KAFKA__SSL_KEY_PASSWORD"}
    cassandra = {"TRENDS_CASSANDRA__PASSWORD"}
    expected = {
        SpeedService(settings): kafka | cassandra,
        ApiService(settings): cassandra | {"TRENDS_SERVING__API_TOKEN"},
        Airflow(settings): kafka | cassandra,
    }
    for svc, names in expected.items():
        env = svc.process_env()
        assert env is not None
        assert not {k for k in env if k.upper() in secret_vars(settings)}, svc.name
        assert not [v for v in env.values() if v in (KAFKA_PW, CASSANDRA_PW, ADMIN_PW, TOKEN)], svc.name
        assert {p.name for p in Path(env["TRENDS_SECRETS_DIR"]).iterdir()} == names, svc.name
    speed = SpeedService(settings)
    written = speed.render_config().read_text()
    assert KAFKA_PW not in written and f"TRENDS_SECRETS_DIR={speed.secrets_dir}" in written
