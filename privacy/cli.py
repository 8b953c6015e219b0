"""``trends privacy``: forget a user, export a user's events, print and verify the erasure ledger, show the status.

A user id given as ``-`` is read from the first line of stdin, which keeps it out of the shell history and the
process list. No command prints or logs a raw id: subjects are shown by their keyed hash.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import click

from infra.errors import TrendsError
from infra.settings import Settings

logger = logging.getLogger(__name__)

USER_HELP = "The user id as producers send it (`-`: read it from the first line of stdin)."


@contextmanager
def _reachable() -> Iterator[None]:
    """Turn the drivers' failures (Cassandra or Kafka unreachable) into a message and exit 1, not a traceback."""
    from cassandra import DriverException
    from cassandra.cluster import NoHostAvailable
    from confluent_kafka import KafkaException

    try:
        yield
    except (NoHostAvailable, DriverException, KafkaException, OSError) as exc:
        msg = f"{type(exc).__name__}: {str(exc)[:300]} (is the stack up? `trends stack status`)"
        raise TrendsError(msg) from exc


def _user(value: str) -> str:
    """Return the user id of the argument (``-``: from stdin); an empty id is a usage error."""
    user = sys.stdin.readline().rstrip("\r\n") if value == "-" else value
    if not user.strip():
        msg = "the user id is empty"
        raise click.BadParameter(msg, param_hint="USER")
    return user


@click.group()
def privacy() -> None:
    """Erasure ("forget") and access ("export") requests of users, and the erasure ledger that proves them."""


@privacy.command()
@click.argument("user", metavar="USER")
@click.option(
    "--exclude/--no-exclude",
    default=None,
    help="Also exclude the user's events from the views (recompute of its hours); default: privacy.exclude_on_forget.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.pass_obj
def forget(settings: Settings, user: str, exclude: bool | None, as_json: bool) -> None:
    """Forget USER now: delete the link to its pseudonym and record the request in the erasure ledger.

    With --exclude the pseudonym is also listed in erased_pseudonyms and the request stays pending until the hours
    holding the user are recomputed without its events. A repeated forget is answered, not repeated.
    """
    from privacy.erasure import forget as run_forget

    with _reachable():
        result = run_forget(settings, _user(user), exclude=exclude)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    req = result.request
    click.echo(f"subject {result.subject_hash[:16]}: {result.message}")
    if req is not None:
        click.echo(
            f"request {req.request_id} ({req.mode}): {req.state}, {len(req.hours)} hour(s); "
            f"ledger entries {', '.join(map(str, result.entries)) or 'none new'}"
        )


@privacy.command()
@click.argument("user", metavar="USER")
@click.option(
    "-o",
    "--output",
    type=click.File("wb"),
    default="-",
    show_default=True,
    help="Where the JSON lines go (`-`: stdout; the summary goes to stderr).",
)
@click.pass_obj
def export(settings: Settings, user: str, output: IO[bytes]) -> None:
    """Export every event of USER that can still be linked to it, as JSON lines (one event per line).

    Reads only the offset ranges that the batch layer's index gives for the hours holding the user, plus the
    records not indexed yet. After a forget it finds nothing.
    """
    from privacy.export import export as run_export

    def write(value: bytes) -> None:
        output.write(value.rstrip(b"\n") + b"\n")

    with _reachable():
        result = run_export(settings, _user(user), write)
    click.echo(result.line(), err=True)


@privacy.command()
@click.option("--verify", is_flag=True, help="Check the whole chain; exit 1 when it is broken or tampered with.")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON lines.")
@click.pass_obj
def ledger(settings: Settings, verify: bool, as_json: bool) -> None:
    """Print the erasure ledger (hashes only), oldest entry first; --verify checks its hash chain."""
    from infra.cassandra import session
    from infra.privacy.ledger import Ledger, verify_chain

    with _reachable(), session(settings) as sess:
        entries = Ledger(settings, sess).entries()
    if verify:
        got = verify_chain(entries)
        if not got.ok:
            click.secho(f"ledger BROKEN at entry {got.broken_at}: {got.problem}", fg="red", err=True)
            sys.exit(1)
        click.echo(f"ledger ok: {got.entries} entries, head {got.head_hash}")
        return
    for e in entries:
        if as_json:
            click.echo(json.dumps({**e.body(), "hash": e.entry_hash}))
            continue
        extra = f" runs {','.join(e.runs)}" if e.runs else ""
        extra += f" reason {e.reason}" if e.reason else ""
        click.echo(
            f"{e.seq:>6} {e.at:%Y-%m-%dT%H:%M:%SZ} request {e.request_id[:12]} subject {e.subject_hash[:16]} "
            f"{e.mode:<7} {e.state:<17} hours {len(e.hours):>4}{extra}  hash {e.entry_hash[:16]}"
        )
    if not entries:
        click.echo("the erasure ledger is empty")


@privacy.command()
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True, help="Requests listed.")
@click.pass_obj
def status(settings: Settings, as_json: bool, limit: int) -> None:
    """Show the erasure requests: pending first (what each waits for), then done and failed ones."""
    from privacy.erasure import status as read_status

    with _reachable():
        st = read_status(settings, limit=limit)
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=2))
        return
    age = "none" if st.oldest_pending_age_s is None else f"{st.oldest_pending_age_s / 86400:.1f} days"
    click.echo(
        f"erasure requests: {st.pending} pending (oldest {age}; deadline {st.deadline_days:g} days), "
        f"{st.done} done, {st.failed} failed"
    )
    for r in st.requests:
        waiting = f" - waiting for {r.waiting_for}" if r.waiting_for else ""
        click.echo(
            f"  {r.request_id[:12]} subject {r.subject_hash[:16]} {r.mode:<7} {r.state:<17} "
            f"since {r.requested_at:%Y-%m-%dT%H:%M:%SZ} hours {len(r.hours)}{waiting}"
        )
