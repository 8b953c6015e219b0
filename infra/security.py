"""What counts as loopback, what counts as a secret, and how secrets and terminal text are shown.

One home for the rules that ``trends stack``, ``trends serve``, ``trends config`` and the CLIs apply before they
bind an address or print a value: a server is bound off loopback only with authentication, a secret is never
printed, and text that came from events (items, dimension values, ids, dead-letter records) reaches a terminal
only with its control characters escaped.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
import socket
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit

from pydantic import SecretStr

from infra.settings_env import env_var

logger = logging.getLogger(__name__)

# Passwords and tokens that guard a server bound off loopback are at least this long (a random 16-character
# token is ~95 bits; a short admin password is guessed online).
MIN_SECRET_CHARS: Final = 16
MASK: Final = "**********"

# Keys whose values are secret: password, secret, token, key, credentials, connections (Airflow's AIRFLOW_CONN_*,
# SQLAlchemy's sql_alchemy_conn, connection URIs) and JAAS configs, in any case. Applied to the keys of free-form
# maps (spark.conf, airflow.config), where over-masking a harmless value costs nothing.
_SECRET_KEY = re.compile(
    r"pass(word|wd|phrase)?|secret|token|key|credential|conn(_|$)|connection[_.]?(uri|url|string)|jaas|private",
    re.IGNORECASE,
)
# A URI with userinfo: scheme://user:password@host or scheme://token@host.
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^/?#@\s]+@", re.ASCII)
# C0 controls, DEL and C1 controls: what a terminal may interpret (ESC starts escape sequences, 0x9B is CSI).
CONTROL_CHARS: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Format characters that reorder or hide text on a terminal (bidi overrides and isolates, zero-width marks).
_INVISIBLE = re.compile(r"[\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


@lru_cache(maxsize=64)
def is_loopback(host: str) -> bool:
    """Tell whether binding ``host`` keeps a server reachable from this machine only.

    An IP address counts when it is a loopback address (127.0.0.0/8, ::1); a wildcard (``0.0.0.0``, ``::``, empty)
    never does; a name counts when every address it resolves to is loopback (``localhost``; Debian's own host name
    on 127.0.1.1). A name that does not resolve is not loopback.
    """
    name = host.strip().strip("[]")
    if not name:
        return False
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses)


def is_secret_key(key: str) -> bool:
    """Tell whether a configuration key names a secret (its value must not be printed)."""
    return bool(_SECRET_KEY.search(key))


def has_userinfo(value: str) -> bool:
    """Tell whether a text is a URI carrying a user name or password (``scheme://user:pw@host``)."""
    return bool(_USERINFO.match(value.strip()))


def mask_uri(value: str) -> str:
    """Return a URI with its userinfo masked (``postgresql://**********@db:5432/airflow``); other text unchanged."""
    text = value.strip()
    if not has_userinfo(text):
        return value
    parts = urlsplit(text)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{MASK}@{host}").geturl()


def mask_value(key: str, value: Any) -> Any:
    """Return ``value`` as it may be shown under ``key``: masked when the key is secret-like or it holds userinfo.

    Maps and lists are masked item by item (a map's own keys decide for their values).
    """
    if isinstance(value, dict):
        return {k: mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_value(key, v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    if is_secret_key(key):
        return MASK
    text = str(value)
    return mask_uri(text) if has_userinfo(text) else value


def escape_text(text: str) -> str:
    r"""Return text safe to print on a terminal: control and invisible format characters as visible escapes.

    ``\x1b[31m`` stays readable as ``\x1b[31m`` instead of turning the terminal red; a backslash is left alone
    (the escapes are for reading, not for parsing back).
    """
    text = CONTROL_CHARS.sub(lambda m: _escape(m.group()), text)
    return _INVISIBLE.sub(lambda m: _escape(m.group()), text)


def escape_json(text: str) -> str:
    r"""Return JSON text (from ``json.dumps(..., ensure_ascii=False)``) with C1, DEL and invisible characters escaped.

    ``json.dumps`` already writes C0 characters as ``\u00XX``; the rest are written as JSON ``\uXXXX`` escapes, so
    the output is still the same JSON value.
    """
    text = re.sub(r"[\x7f-\x9f]", lambda m: f"\\u{ord(m.group()):04x}", text)
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def exposure_problem(what: str, host: str, secret: str | None, *, guard_var: str, host_var: str) -> str | None:
    """Return why serving ``what`` on ``host`` guarded by ``secret`` is unsafe, or None when it is fine.

    Loopback is always fine. Off loopback the secret must be set and at least :data:`MIN_SECRET_CHARS` long.

    :arg guard_var: the variable that sets the secret, named in the message.
    :arg host_var: the variable (or option) that moves the address back to loopback.
    """
    if is_loopback(host):
        return None
    shown = host or "every interface"
    if not secret:
        return (
            f"refusing to serve {what} on {shown} (not loopback) without authentication: set {guard_var} "
            f"(at least {MIN_SECRET_CHARS} characters), or bind 127.0.0.1 with {host_var}."
        )
    short = too_short(guard_var, secret)
    return f"refusing to serve {what} on {shown} (not loopback): {short}" if short else None


_Command = TypeVar("_Command", bound=Callable[..., Any])


def listen_options(section: str) -> Callable[[_Command], _Command]:
    """Return the ``--host``, ``--port`` and ``--insecure`` options of a server whose address is ``section``'s.

    ``trends serve`` and ``trends collect`` share them, and :func:`refuse_exposure` judges what they ask for.
    """
    import click  # noqa: PLC0415 - only the commands that serve need it

    options = (
        click.option("--host", help=f"Bind address (default: {section}.host, loopback)."),
        click.option("--port", type=click.IntRange(0, 65535), help=f"Port (default: {section}.port)."),
        click.option(
            "--insecure",
            is_flag=True,
            help="Bind a non-loopback address without an API token (or with a short one); logs a warning.",
        ),
    )

    def decorate(command: _Command) -> _Command:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def refuse_exposure(what: str, host: str, token: SecretStr | None, *, host_var: str, insecure: bool, risk: str) -> None:
    """Refuse to serve ``what`` on ``host`` without a proper API token (a usage error), unless ``insecure``.

    The check of ``trends serve`` and ``trends collect``, both guarded by ``serving.api_token``. With ``insecure``
    an unsafe exposure is served, with a warning saying what anyone who reaches it can do.

    :arg host_var: the option and variable that move the address back to loopback, named in the message.
    :arg risk: what anyone reaching the server could do (``query it``, ``write events``).
    :raises click.UsageError: when the exposure is unsafe and ``insecure`` is not given.
    """
    secret = token.get_secret_value() if token is not None else None
    problem = exposure_problem(what, host, secret, guard_var=env_var("serving.api_token"), host_var=host_var)
    if problem is None:
        return
    if not insecure:
        import click  # noqa: PLC0415 - only the commands that serve need it

        msg = f"{problem} (--insecure serves it anyway)"
        raise click.UsageError(msg)
    logger.warning(
        "--insecure: serving %s on %s without proper authentication: anyone who reaches it can %s", what, host, risk
    )


def too_short(var: str, secret: str) -> str | None:
    """Return why a secret guarding a server off loopback is too short (``var`` names it), or None."""
    if len(secret) < MIN_SECRET_CHARS:
        return f"{var} has {len(secret)} characters, off loopback it needs at least {MIN_SECRET_CHARS}."
    return None


def bearer_refusal(authorization: str | None, token: str | None) -> int | None:
    """Return the HTTP status that refuses a request's ``Authorization`` header, or None when it may pass.

    No token configured: every request passes. Otherwise a request without ``Bearer <token>`` gets 401 and one
    with a different token 403; the comparison takes the same time whatever the token sent.
    """
    if token is None:
        return None
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value:
        return 401
    return None if secrets.compare_digest(value.encode(), token.encode()) else 403
