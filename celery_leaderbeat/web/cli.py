"""``celery -A proj leaderbeat web``: the cluster in a browser (see :mod:`.wsgi`)."""

from __future__ import annotations

import click

from ..ops.cli_group import EXIT_CODES_SHORT, USAGE, cluster_of, echo, fail, leaderbeat
from . import server
from .wsgi import TOKEN_ENV, WebApp

#: the port ``leaderbeat web`` listens on unless told
DEFAULT_PORT = 8400


@leaderbeat.command(name="web", epilog=EXIT_CODES_SHORT)
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; mind --token).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT,
              show_default=True, help="Port to listen on (0: any free one, printed).")
@click.option("--enable-actions", is_flag=True,
              help="Let the pages pause, resume, trigger, backfill and step down "
                   "(needs --token).")
@click.option("--token", envvar=TOKEN_ENV, default=None, show_envvar=True,
              help="Every request must carry it: HTTP basic (any user name, the token as "
                   "password) or 'Authorization: Bearer <token>'.")
@click.pass_context
def web(ctx: click.Context, bind: str, port: int, enable_actions: bool,
        token: str | None) -> None:
    """Serve the cluster, the entries and their history as web pages and a JSON API.

    Read-only unless --enable-actions; pages update themselves every second or two.
    Ctrl-C stops it."""
    if enable_actions and not token:
        raise fail(USAGE, f"--enable-actions needs --token (or {TOKEN_ENV}): actions must be "
                          "authenticated")
    cluster = cluster_of(ctx)
    cluster.store.ping()  # Redis unreachable: exit 69 now, not on the first page
    app = WebApp(cluster, enable_actions=enable_actions, token=token or None)
    app.view.definitions()  # the first page need not parse the whole schedule
    try:
        httpd = server.make(app, bind, port)
    except OSError as exc:
        raise fail(USAGE, f"cannot listen on {bind}:{port}: {exc.strerror or exc} "
                          "(choose another --port or --bind)") from exc
    host, bound = str(httpd.server_address[0]), httpd.server_address[1]
    mode = "actions enabled" if enable_actions else "read-only"
    echo(f"leaderbeat web: serving http://{host}:{bound}/ ({mode}"
         f"{', token required' if token else ''}); Ctrl-C stops")
    if token is None and bind not in ("127.0.0.1", "::1", "localhost"):
        echo(f"leaderbeat web: no --token: anyone who reaches {bind}:{bound} can read the "
             "cluster's state", err=True)
    try:
        httpd.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


__all__ = ["DEFAULT_PORT", "web"]
