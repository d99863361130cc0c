"""``echod``: the command line. Storage lives in store.py and db.py, ingest in ingest.py."""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC

import click
import sqlalchemy.exc

from ingero.cli_common import config_option, keygen_command, load_settings
from ingero.errors import IngeroError
from ingero.runtime import SignalFlags, serve_metrics, setup_logging
from ingero.sdnotify import Notifier
from ingero.settings import click_options

from .store import checks, db
from .store.writer import IngestResult, batch_fault, first_line, write_batch
from .config import DEFAULT_CONFIG, SETTINGS
from .api.supervisor import ApiProcess, check_tls
from .embedded import EmbeddedPostgres
from .errors import DatabaseUnavailable
from .ingest import IngestServer
from .metrics import EchoMetrics
from .store.retention import Policy
from .store.retention import apply as apply_retention
from .slurmjobs import SlurmStates
from .access.tokens_cli import token_group

log = logging.getLogger("echod")


@contextlib.contextmanager
def database(cfg, revive: bool = False):
    """The configured PostgreSQL, or echod's private cluster for as long as the block runs
    (left running if it already was: a running echod's, which ``echod db status`` shares).
    Yields the DSN and, with ``revive``, a check to call now and then that starts the private
    cluster again when it died (None for a configured server: its own supervisor restarts it)."""
    if cfg.dsn:
        yield cfg.dsn, None
        return
    embedded = EmbeddedPostgres(cfg.state_dir / "postgres")
    already = embedded.running()
    dsn = embedded.start()
    try:
        yield dsn, Reviver(embedded) if revive else None
    finally:
        if not already:
            embedded.stop()


class Reviver:
    """Every few seconds: is the private cluster up? If not (killed, crashed), start it again;
    ingest waits meanwhile (fleetd keeps the batches) and the API answers 503."""

    EVERY_S = 2.0

    def __init__(self, embedded: EmbeddedPostgres):
        self.embedded = embedded
        self.next_check = time.monotonic() + self.EVERY_S

    def __call__(self, now: float) -> None:
        if now < self.next_check:
            return
        self.next_check = now + self.EVERY_S
        if self.embedded.running():
            return
        click.echo("echod: the private PostgreSQL is down; starting it again", err=True)
        try:
            self.embedded.start()
            click.echo("echod: the private PostgreSQL is back", err=True)
        except IngeroError as exc:
            click.echo(f"echod: the private PostgreSQL did not start ({exc}); trying again",
                       err=True)


def ticks(*calls):
    """One on_tick for the ingest loop from those of ``calls`` that are not None."""
    calls = [c for c in calls if c is not None]

    def tick(now: float) -> None:
        for call in calls:
            call(now)
    return tick


def writer(engine):
    """write_batch (which refuses the rows the database refuses, and stores the rest),
    with any other database error turned into DatabaseUnavailable (the batch is not
    acknowledged: it comes again, and the loop backs off), and any other error acknowledged
    as the batch refused, logged: a batch that fails on a bug of echod's must not come again
    and again, nor stop echod for every cluster."""
    import psycopg

    def write(batch: dict):
        try:
            return write_batch(engine, batch)
        except (sqlalchemy.exc.DBAPIError, psycopg.Error) as exc:
            if batch_fault(exc):   # one write_apart could not pin on its rows
                return IngestResult(0, 0, [("batch", -1, first_line(exc))])
            engine.dispose()
            raise DatabaseUnavailable(first_line(exc)) from None
        except Exception as exc:
            log.exception("storing a batch failed")
            return IngestResult(0, 0, [("batch", -1, f"echod failed on it: {exc!r}")])
    return write



def upgrade(engine, notifier: Notifier | None = None) -> str:
    """Migrate at start, systemd told to wait meanwhile (a migration over a large store takes
    longer than TimeoutStartSec); a database that cannot be reached is a one-line error."""
    try:
        with (notifier or Notifier({})).extending(
                f"migrating the schema to {db.head_revision()}"):
            return db.upgrade(engine)
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
        raise DatabaseUnavailable(f"cannot reach the database: {first_line(exc)}") from None


def retention(engine, policy: Policy):
    def keep_what_is_owed():
        for done in apply_retention(engine, policy):
            click.echo(f"echod: retention {done}", err=True)
    return keep_what_is_owed


def settings(config, flags):
    cfg = load_settings(SETTINGS, "ECHOD", config, DEFAULT_CONFIG, flags)
    setup_logging(cfg.log_level, "echod")
    return cfg


@click.group(invoke_without_command=True, context_settings={"max_content_width": 100},
             epilog="Example: echod --dsn postgresql://ingero@db/ingero --tls-cert "
                    "/etc/ingero/echod.crt --tls-key /etc/ingero/echod.key")
@config_option(DEFAULT_CONFIG)
@click_options(SETTINGS)
@click.pass_context
def main(ctx: click.Context, config: str | None, **flags) -> None:
    """ingero's event store: keeps what fleetd forwards in PostgreSQL and answers questions
    about it over HTTP (a Flask API under gunicorn) and MCP.

    With no --dsn it runs a private PostgreSQL cluster under --state-dir. The API needs
    --tls-cert and --tls-key (or --insecure-no-tls) and tokens from 'echod token create'.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = (config, flags)
        return
    cfg = settings(config, flags)
    checks.KEEP_DAYS = cfg.retention_days      # no event older than the store keeps
    metrics = EchoMetrics()
    signals = SignalFlags().install()  # before the database starts, so SIGTERM stops it too
    try:
        tls = check_tls(cfg) if cfg.api_bind else None   # a bad setup fails before anything runs
        with database(cfg, revive=True) as (dsn, revive):
            engine = db.make_engine(dsn)
            revision = upgrade(engine, Notifier())
            click.echo(f"echod: schema at {revision}", err=True)
            api = ApiProcess(cfg, tls, engine, revision) if cfg.api_bind else None
            http = None
            try:
                if cfg.metrics_addr:
                    http = serve_metrics(cfg.metrics_addr, metrics.registry)
                if api is not None and not signals.stop:
                    api.start()
                slurm = SlurmStates(engine, cfg.slurm_states, cfg.slurm_interval, metrics)
                code = 0 if signals.stop else IngestServer(
                    cfg, writer(engine), metrics, signals,
                    housekeeping=retention(engine, Policy.of(cfg)),
                    on_reload=api.reload if api else None,
                    on_tick=ticks(api.check if api else None, revive, slurm.tick)).run()
            finally:
                if api is not None:
                    api.stop(drain=signals.stop)
                if http is not None:
                    http.shutdown()
                engine.dispose()
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.exit(code)


@main.group("db")
def db_group() -> None:
    """The database schema: upgrade it, or show where it stands.

    Example: echod --dsn postgresql://ingero@db/ingero db status
    """


def _with_engine(action):
    config, flags = click.get_current_context().find_root().obj
    cfg = settings(config, flags)
    try:
        with database(cfg) as (dsn, _):
            engine = db.make_engine(dsn)
            try:
                return action(engine)
            except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
                raise DatabaseUnavailable(f"cannot reach the database: {first_line(exc)}") \
                    from None
            finally:
                engine.dispose()
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None


@db_group.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration this echod knows (idempotent). Example: echod db upgrade"""
    click.echo(f"schema at {_with_engine(upgrade)}")


@db_group.command("status")
def db_status() -> None:
    """Print the database's schema revision and the newest this echod knows.

    Example: echod db status
    """
    current, head = _with_engine(db.status)
    state = "up to date" if current == head else "needs 'echod db upgrade'"
    click.echo(f"current {current or 'none'}\nhead    {head}\n{state}")


@db_group.command("retention")
@click.option("--as-of", "as_of", metavar="TIME", type=click.DateTime(
    ["%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]),
    help="Apply it as it will be due at this UTC time instead of now (what is past its "
         "window then is dropped or thinned now).")
@click.option("--dry-run", is_flag=True, help="Say what is due; change nothing.")
def db_retention(as_of, dry_run: bool) -> None:
    """Apply the retention policy (--retention-days, --raw-days, --raw-days-by-kind,
    --evidence-window) now rather than at echod's next hourly pass, and say what it did.

    Example: echod --raw-days 2 db retention --dry-run
    """
    config, flags = click.get_current_context().find_root().obj
    policy = Policy.of(settings(config, flags))
    now = None if as_of is None else as_of.replace(tzinfo=UTC).timestamp()
    done = _with_engine(lambda engine: apply_retention(engine, policy, now, dry_run=dry_run))
    click.echo("\n".join(done) if done else "nothing is due")


main.add_command(keygen_command("/etc/ingero/keys", "echod", "echod"))
main.add_command(token_group)
