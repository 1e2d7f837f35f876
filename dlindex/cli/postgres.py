"""`dlindex postgres start|stop|status`: a local PostgreSQL server for a server catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dlindex.cli._shared import JsonFlag, handle_errors, print_json

app = typer.Typer(
    name="postgres", help="Start, stop or show a local PostgreSQL server for a server catalog.", no_args_is_help=True
)
DirArgument = Annotated[
    Path, typer.Argument(metavar="DIR", help="The server's data folder (made and initialised if new or empty).")
]
BindirOption = Annotated[
    Path | None,
    typer.Option(
        "--bindir", metavar="DIR", show_default="pg_config --bindir, PATH, then /usr/lib/postgresql/*/bin",
        help="The folder of PostgreSQL's initdb, pg_ctl and psql.",
    ),
]  # fmt: skip


@app.command("start")
@handle_errors
def start(
    data_dir: DirArgument,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, show_default="the last one, else a free one", help="TCP port."),
    ] = None,
    bindir: BindirOption = None,
) -> None:
    """Start the server of DIR (initialised first if new) on 127.0.0.1; print its catalog URL.

    export DLINDEX_DB=$(dlindex postgres start ./pg)
    """
    from dlindex.catalog.postgres.server import start_local_postgres

    url = start_local_postgres(data_dir, port=port, bindir=bindir)
    typer.echo(url)
    typer.echo(f"export DLINDEX_DB={url}", err=True)


@app.command("stop")
@handle_errors
def stop(data_dir: DirArgument, bindir: BindirOption = None) -> None:
    """Stop the server of DIR; its data stays, and start runs it again.

    dlindex postgres stop ./pg
    """
    from dlindex.catalog.postgres.server import stop_local_postgres

    stopped = stop_local_postgres(data_dir, bindir=bindir)
    typer.echo(f"{'stopped' if stopped else 'not running'}: {data_dir}", err=True)


@app.command("status")
@handle_errors
def status(data_dir: DirArgument, as_json: JsonFlag = False, bindir: BindirOption = None) -> None:
    """Whether the server of DIR runs, with its pid, port and URL.

    dlindex postgres status ./pg --json | jq -r .url
    """
    from dlindex.catalog.postgres.server import local_postgres_status

    s = local_postgres_status(data_dir, bindir=bindir)
    if as_json:
        print_json(s.as_dict())
    elif s.running:
        typer.echo(f"running: {s.url} (pid {s.pid}, {s.data_dir})")
    else:
        typer.echo(f"stopped: {s.data_dir}" + (f" (port {s.port})" if s.port else ""))
