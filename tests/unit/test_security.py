"""Loopback unless secured: the stack, `trends serve` and Airflow refuse to bind off loopback without auth.

Every refusal here happens before anything is launched, so these tests start no server: a refused configuration
leaves no pid file, no rendered config and no process behind.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from infra.errors import StackError
from infra.security import MIN_SECRET_CHARS, exposure_problem, is_loopback
from infra.settings import Settings
from stack import control
from stack.airflow.service import Airflow
from stack.services.pipeline import ApiService

LONG_SECRET = "x" * MIN_SECRET_CHARS
ANY = "0.0.0.0"  # noqa: S104 - the wildcard these tests expect to be refused (nothing binds it)


def _settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    base = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    update = {name: getattr(base, name).model_copy(update=values) for name, values in sections.items()}
    return base.model_copy(update=update)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.21", "127.1.2.3", "::1", "[::1]", "localhost"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", [ANY, "::", "", "10.0.0.5", "192.168.1.20", "8.8.8.8", "no-such-host.invalid"])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_exposure_problem_needs_a_long_secret_off_loopback_only() -> None:
    kw = {"guard_var": "TOKEN_VAR", "host_var": "HOST_VAR"}
    assert exposure_problem("x", "127.0.0.1", None, **kw) is None
    missing = exposure_problem("x", ANY, None, **kw)
    assert missing is not None and "TOKEN_VAR" in missing and "HOST_VAR" in missing
    short = exposure_problem("x", "10.1.1.1", "x" * (MIN_SECRET_CHARS - 1), **kw)
    assert short is not None and str(MIN_SECRET_CHARS) in short
    assert exposure_problem("x", "10.1.1.1", LONG_SECRET, **kw) is None


def _nothing_launched(settings: Settings) -> None:
    leftovers = [p for p in settings.data_dir.rglob("*") if p.is_file()] if settings.data_dir.exists() else []
    assert leftovers == [], leftovers


@pytest.mark.parametrize("servers", ["10.0.0.5:9092", f"{ANY}:9092", "127.0.0.11:19092,192.168.7.7:19093"])
def test_stack_refuses_kafka_off_loopback(tmp_path: Path, servers: str) -> None:
    settings = _settings(tmp_path, kafka={"bootstrap_servers": servers})
    with pytest.raises(StackError, match="not a loopback address") as err:
        control.up(settings, ["kafka"])
    for setting in ("TRENDS_KAFKA__SECURITY_PROTOCOL", "TRENDS_KAFKA__SASL_USERNAME", "TRENDS_KAFKA__SASL_PASSWORD"):
        assert setting in str(err.value)
    assert "SASL" in str(err.value)
    _nothing_launched(settings)
    # start() checks too, for callers that skip up().
    node = control.nodes(settings, "kafka")[-1]
    with pytest.raises(StackError, match="not a loopback address"):
        node.start("/nonexistent/java")
    _nothing_launched(settings)


@pytest.mark.parametrize("points", [["10.0.0.5"], [ANY], ["127.0.0.21", "10.9.9.9"]])
def test_stack_refuses_cassandra_off_loopback(tmp_path: Path, points: list[str]) -> None:
    settings = _settings(tmp_path, cassandra={"contact_points": points})
    with pytest.raises(StackError, match="not a loopback address") as err:
        control.up(settings)  # the default servers: kafka (loopback, fine) is refused along with cassandra
    for setting in ("PasswordAuthenticator", "TRENDS_CASSANDRA__USERNAME", "TRENDS_CASSANDRA__PASSWORD"):
        assert setting in str(err.value)
    _nothing_launched(settings)


def test_stack_accepts_loopback_clusters(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        kafka={"bootstrap_servers": "127.0.0.11:9092,127.0.0.12:9092"},
        cassandra={"contact_points": ["127.0.0.21", "127.0.0.22"]},
    )
    for node in [*control.nodes(settings, "kafka"), *control.nodes(settings, "cassandra")]:
        node.check_safe()  # no exception


def test_stack_refuses_open_api_off_loopback(tmp_path: Path) -> None:
    settings = _settings(tmp_path, serving={"host": ANY})
    with pytest.raises(StackError, match="TRENDS_SERVING__API_TOKEN"):
        control.up(settings, ["api"])
    _nothing_launched(settings)
    secured = _settings(tmp_path, serving={"host": ANY, "api_token": SecretStr(LONG_SECRET)})
    ApiService(secured).check_safe()


def test_empty_api_token_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRENDS_SERVING__API_TOKEN", "")
    assert Settings().serving.api_token is None
    monkeypatch.setenv("TRENDS_SERVING__API_TOKEN", "   ")
    assert Settings().serving.api_token is None
    monkeypatch.setenv("TRENDS_SERVING__API_TOKEN", "s3cret")
    token = Settings().serving.api_token
    assert token is not None and token.get_secret_value() == "s3cret"


def _serve(settings: Settings, *args: str) -> Any:
    from serving.cli import serve

    return CliRunner().invoke(serve, list(args), obj=settings)


@pytest.mark.parametrize(("host", "token"), [(ANY, None), ("10.0.0.5", None), (ANY, ""), (ANY, "short-token")])
def test_serve_refuses_non_loopback_without_a_proper_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str, token: str | None
) -> None:
    import uvicorn

    served: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
    if token is not None:
        monkeypatch.setenv("TRENDS_SERVING__API_TOKEN", token)
    settings = Settings(data_dir=tmp_path)  # the empty token goes through settings loading, as in production
    result = _serve(settings, "--host", host)
    assert result.exit_code == 2, result.output
    assert "TRENDS_SERVING__API_TOKEN" in result.output and "--insecure" in result.output
    assert served == []


def test_serve_with_insecure_warns_and_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import uvicorn

    served: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
    with caplog.at_level(logging.WARNING, logger="serving.cli"):
        result = _serve(Settings(data_dir=tmp_path), "--host", ANY, "--port", "18000", "--insecure")
    assert result.exit_code == 0, result.output
    assert served and served[0]["host"] == ANY
    assert any("--insecure" in r.getMessage() for r in caplog.records)


def test_serve_allows_loopback_and_a_long_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    served: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.append(kw))
    assert _serve(Settings(data_dir=tmp_path), "--host", "127.0.0.1").exit_code == 0
    secured = _settings(tmp_path, serving={"api_token": SecretStr(LONG_SECRET)})
    assert _serve(secured, "--host", ANY).exit_code == 0
    assert [kw["host"] for kw in served] == ["127.0.0.1", ANY]


def _airflow(tmp_path: Path, **airflow: Any) -> Airflow:
    return Airflow(_settings(tmp_path, airflow=airflow))


def test_airflow_checks_the_host_after_config_overrides(tmp_path: Path) -> None:
    airflow = _airflow(tmp_path, config={"AIRFLOW__API__HOST": ANY})
    assert airflow.api_host == ANY
    with pytest.raises(StackError, match="default admin password"):
        airflow.check_safe()
    with pytest.raises(StackError, match="default admin password"):
        airflow.start("")
    assert not airflow.cfg_file.exists()  # refused before any file was written


def test_airflow_port_override_is_where_it_is_reached(tmp_path: Path) -> None:
    airflow = _airflow(tmp_path, config={"AIRFLOW__API__PORT": "18181"})
    assert airflow.url.endswith(":18181")
    assert airflow.airflow_env()["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18181/execution/"


def test_airflow_admin_password_minimum_length_off_loopback(tmp_path: Path) -> None:
    short = SecretStr("x" * (MIN_SECRET_CHARS - 1))
    with pytest.raises(StackError, match=f"at least {MIN_SECRET_CHARS}"):
        _airflow(tmp_path, host=ANY, admin_password=short).check_safe()
    _airflow(tmp_path, host="127.0.0.1", admin_password=short).check_safe()  # loopback: any password
    _airflow(tmp_path, host=ANY, admin_password=SecretStr(LONG_SECRET)).check_safe()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"}, "ALL_ADMINS"),
        ({"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": "/tmp/weak.json"}, "PASSWORDS_FILE"),
    ],
)
def test_airflow_refuses_auth_bypasses_off_loopback(tmp_path: Path, config: dict[str, str], needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        _airflow(tmp_path, host=ANY, admin_password=SecretStr(LONG_SECRET), config=config).check_safe()
    _airflow(tmp_path, admin_password=SecretStr(LONG_SECRET), config=config).check_safe()  # loopback: allowed


def test_escape_text_leaves_nothing_a_terminal_interprets() -> None:
    from infra.security import CONTROL_CHARS, escape_text

    evil = "a\x1b[31mred\x00nul\x9bcsi\x7fdel\ttab\nnl\u202egnp.exe\u200bzw"
    shown = escape_text(evil)
    assert CONTROL_CHARS.search(shown) is None
    assert "\u202e" not in shown and "\u200b" not in shown
    assert shown == "a\\x1b[31mred\\x00nul\\x9bcsi\\x7fdel\\x09tab\\x0anl\\u202egnp.exe\\u200bzw"
    assert escape_text("café #ok ✓") == "café #ok ✓"  # ordinary text is untouched


def test_escape_json_keeps_the_same_json_value() -> None:
    import json

    from infra.security import CONTROL_CHARS, escape_json

    value = {"item": "a\x1b[31m\x9b\x7f\u202e ok é", "n": 1}
    text = escape_json(json.dumps(value, ensure_ascii=False))
    assert CONTROL_CHARS.search(text) is None and "\u202e" not in text
    assert "é" in text
    assert json.loads(text) == value


def test_masking_helpers() -> None:
    from infra.security import MASK, has_userinfo, is_secret_key, mask_uri, mask_value

    assert (
        mask_uri("postgresql+psycopg2://airflow:pw@db:5432/airflow") == f"postgresql+psycopg2://{MASK}@db:5432/airflow"
    )
    assert mask_uri("https://token@host/x") == f"https://{MASK}@host/x"
    assert mask_uri("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"
    assert not has_userinfo("mailto:someone@example.com") and not has_userinfo("a@b")
    for key in ("AIRFLOW_CONN_PG", "spark.hadoop.fs.s3a.secret.key", "AIRFLOW__CORE__FERNET_KEY", "db_password",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "api_token", "GOOGLE_APPLICATION_CREDENTIALS"):  # fmt: skip
        assert is_secret_key(key), key
    for key in ("spark.sql.shuffle.partitions", "AIRFLOW__CORE__PARALLELISM", "spark.cassandra.connection.host"):
        assert not is_secret_key(key), key
    assert mask_value("conf", {"a.password": "x", "b": "y", "c": ["s3://k:s@b/p"]}) == {
        "a.password": MASK,
        "b": "y",
        "c": [f"s3://{MASK}@b/p"],
    }


def _sasl(tmp_path: Path, servers: str, password: str = LONG_SECRET, **extra: Any) -> Settings:
    kafka = {
        "bootstrap_servers": servers,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "trends",
        "sasl_password": SecretStr(password),
        **extra,
    }
    return _settings(tmp_path, kafka=kafka)


def test_kafka_with_sasl_plain_renders_sasl_on_every_listener_in_a_private_file(tmp_path: Path) -> None:
    import stat

    node = control.nodes(_sasl(tmp_path, "127.0.0.1:19092"), "kafka")[0]
    node.conf_dir.mkdir(parents=True)
    config = node.render_config()
    text = config.read_text()
    assert "listeners=SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:9093" in text
    assert "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT" in text
    assert "PLAINTEXT:PLAINTEXT" not in text and "sasl.mechanism.controller.protocol=PLAIN" in text
    assert f'user_trends="{LONG_SECRET}"' in text and text.count("PlainLoginModule") == 2
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # it holds the password


def test_kafka_off_loopback_with_sasl_plain_is_allowed(tmp_path: Path) -> None:
    node = control.nodes(_sasl(tmp_path, "10.0.0.5:9092"), "kafka")[0]
    node.check_safe()  # no exception: the stack runs it with SASL


@pytest.mark.parametrize(
    ("servers", "password", "extra", "needle"),
    [
        ("10.0.0.5:9092", "short", {}, "at least 16"),
        ("127.0.0.1:9092", LONG_SECRET, {"sasl_mechanism": "SCRAM-SHA-512"}, "TRENDS_KAFKA__SASL_MECHANISM=PLAIN"),
        ("127.0.0.1:9092", LONG_SECRET, {"sasl_username": None}, "TRENDS_KAFKA__SASL_USERNAME"),
        ("127.0.0.1:9092", 'has"quote' + LONG_SECRET, {}, "quotes"),
        ("127.0.0.1:9092", LONG_SECRET, {"sasl_username": "a b"}, "letters, digits"),
        ("127.0.0.1:9092", LONG_SECRET, {"security_protocol": "SASL_SSL"}, "TLS"),
        ("10.0.0.5:9092", LONG_SECRET, {"security_protocol": "SSL"}, "TLS"),
    ],
)
def test_kafka_configurations_the_stack_cannot_run_are_refused(
    tmp_path: Path, servers: str, password: str, extra: dict[str, Any], needle: str
) -> None:
    settings = _sasl(tmp_path, servers, password, **extra)
    with pytest.raises(StackError, match=needle):
        control.up(settings, ["kafka"])
    _nothing_launched(settings)


def _cas_auth(
    tmp_path: Path, points: list[str], user: str | None = "trends", password: str | None = LONG_SECRET
) -> Settings:
    secret = SecretStr(password) if password is not None else None
    return _settings(tmp_path, cassandra={"contact_points": points, "username": user, "password": secret})


def test_cassandra_with_credentials_renders_password_authentication(tmp_path: Path) -> None:
    node = control.nodes(_cas_auth(tmp_path, ["10.0.0.5"]), "cassandra")[0]
    node.check_safe()  # off loopback, allowed: the stack runs it with PasswordAuthenticator
    node.conf_dir.mkdir(parents=True)
    text = node.render_config().read_text()
    assert "authenticator: PasswordAuthenticator" in text and "authorizer: CassandraAuthorizer" in text
    plain = control.nodes(_settings(tmp_path), "cassandra")[0]
    assert "authenticator: AllowAllAuthenticator" in plain.render_config().read_text()


@pytest.mark.parametrize(
    ("points", "user", "password", "needle"),
    [
        (["10.0.0.5"], "trends", "short", "at least 16"),
        (["127.0.0.1"], "trends", None, "set both"),
        (["127.0.0.1"], None, LONG_SECRET, "set both"),
        (["127.0.0.1"], 'x"; DROP', LONG_SECRET, "lower-case identifier"),
    ],
)
def test_cassandra_credentials_the_stack_cannot_use_are_refused(
    tmp_path: Path, points: list[str], user: str | None, password: str | None, needle: str
) -> None:
    settings = _cas_auth(tmp_path, points, user, password)
    with pytest.raises(StackError, match=needle):
        control.up(settings, ["cassandra"])
    _nothing_launched(settings)
