"""Local PostgreSQL servers for a server catalog: a data folder initialised, started, stopped, described.

``dlindex postgres start DIR`` and the test suite's server both come from here. The server
listens on a loopback address only and trusts every local connection (a development server,
like ``initdb -A trust``), preloads ``pg_stat_statements`` (the workload of index advice) and
holds a database named ``dlindex``. PostgreSQL refuses to run as root, so under root the
server programs run as the ``postgres`` OS user, who then owns the data folder.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlindex.errors import DlindexError, InputError

DATABASE = "dlindex"
SUPERUSER = "postgres"
SERVER_USER = "postgres"  # the OS user the server runs as when dlindex runs as root
START_TIMEOUT_S = 60
CONF_FILE = "dlindex.conf"  # dlindex's settings, included last from postgresql.conf
LOG_FILE = "server.log"
PROGRAMS = ("initdb", "pg_ctl", "psql")
_VERSIONED_BINDIRS = "/usr/lib/postgresql/*/bin"  # Debian and Ubuntu: one folder per major version
_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last a NUL
_LOOPBACK_NAMES = ("localhost",)

_HAS_DATABASE = "SELECT 1 FROM pg_database WHERE datname = 'dlindex'"
_CREATE_DATABASE = "CREATE DATABASE dlindex"
_INCLUDE = f"\n# dlindex postgres start: port, addresses and preloads\ninclude_if_exists = '{CONF_FILE}'\n"
_CAUSE = re.compile(r"(LOG|ERROR):\s+(invalid|could not|unrecognized|syntax error|parameter)")
_SETTING = re.compile(r"^\s*(\w+)\s*=\s*'?([^'#\n]*)'?", re.MULTILINE)


@dataclass(frozen=True)
class PostgresStatus:
    """A local server's data folder and whether its server runs (port and URL when known)."""

    data_dir: Path
    running: bool
    pid: int | None
    port: int | None
    url: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"data_dir": str(self.data_dir), "running": self.running, "pid": self.pid, "port": self.port,
                "url": self.url}  # fmt: skip


def find_bindir(bindir: Path | str | None = None) -> Path:
    """The folder holding initdb, pg_ctl and psql: ``bindir``, else ``pg_config --bindir``, PATH,
    then the newest ``/usr/lib/postgresql/*/bin``."""
    if bindir is not None:
        if not _has_programs(Path(bindir)):
            raise InputError(f"no PostgreSQL server programs ({', '.join(PROGRAMS)}) in {bindir}")
        return Path(bindir)
    for candidate in _candidate_bindirs():
        if _has_programs(candidate):
            return candidate
    raise InputError(
        "PostgreSQL is not installed: no initdb, pg_ctl and psql through pg_config, PATH or "
        f"{_VERSIONED_BINDIRS}; install it (apt-get install postgresql-15 postgresql-contrib) or give --bindir"
    )


def start_local_postgres(
    data_dir: Path | str, *, port: int | None = None, host: str = "127.0.0.1", bindir: Path | str | None = None
) -> str:
    """Start the server of ``data_dir`` (initialised first if the folder is new or empty) and return
    its URL, ``postgresql://postgres@HOST:PORT/dlindex``.

    Args:
        port: the TCP port; default: the one the folder last ran on, else a free one.
        host: a loopback address to listen on (every local connection is trusted).
    """
    if host not in _LOOPBACK_NAMES and not _is_loopback(host):
        raise InputError(f"{host} is not a loopback address: a dlindex dev server trusts every connection it accepts")
    if port is not None and not 0 < port < 65536:
        raise InputError(f"port {port} is not a TCP port (1-65535)")
    data_dir = Path(data_dir).absolute()
    bins = find_bindir(bindir)
    user = _server_user()
    current = _status(data_dir, bins, user) if _is_data_dir(data_dir) else None
    if current is not None and current.running:
        if port is not None and port != current.port:
            raise InputError(f"the server of {data_dir} already runs on port {current.port}; stop it first")
        assert current.url is not None
        return current.url
    if current is None:
        _initdb(data_dir, bins, user)
    port = port or _setting_int(data_dir, "port") or _free_port(host)
    if not _port_free(host, port):
        raise InputError(f"port {port} on {host} is in use; pick another with --port")
    _write_conf(data_dir, host, port, user)
    _start(data_dir, bins, user, port)
    _ensure_database(bins, host, port)
    return _url(host, port)


def stop_local_postgres(data_dir: Path | str, *, bindir: Path | str | None = None, mode: str = "fast") -> bool:
    """Stop the server of ``data_dir``; False if it was not running.

    Args:
        mode: pg_ctl's shutdown mode: ``fast`` ends open sessions; ``immediate`` kills the server
            without a checkpoint (as a crash would; the next start recovers).
    """
    if mode not in ("smart", "fast", "immediate"):
        raise InputError(f"not a pg_ctl shutdown mode: {mode!r}")
    data_dir = _require_data_dir(Path(data_dir).absolute())
    bins = find_bindir(bindir)
    user = _server_user()
    if not _status(data_dir, bins, user).running:
        return False
    proc = _run([bins / "pg_ctl", "stop", "-D", data_dir, "-m", mode, "-w", "-t", str(START_TIMEOUT_S), "-s"], user)
    if proc.returncode != 0:
        raise DlindexError(f"PostgreSQL in {data_dir} did not stop: {_last_line(proc.stderr or proc.stdout)}")
    return True


def local_postgres_status(data_dir: Path | str, *, bindir: Path | str | None = None) -> PostgresStatus:
    """Whether the server of ``data_dir`` runs, with its pid, port and URL."""
    data_dir = _require_data_dir(Path(data_dir).absolute())
    return _status(data_dir, find_bindir(bindir), _server_user())


# --- the data folder ------------------------------------------------------------------------------


def _is_data_dir(data_dir: Path) -> bool:
    try:
        return (data_dir / "PG_VERSION").is_file()
    except PermissionError:
        raise InputError(f"cannot read {data_dir}: permission denied") from None


def _require_data_dir(data_dir: Path) -> Path:
    if not _is_data_dir(data_dir):
        raise InputError(
            f"{data_dir} is not a PostgreSQL data folder (no PG_VERSION); start one with dlindex postgres start"
        )
    return data_dir


def _initdb(data_dir: Path, bins: Path, user: pwd.struct_passwd | None) -> None:
    if data_dir.exists() and not data_dir.is_dir():
        raise InputError(f"{data_dir} is a file, not a PostgreSQL data folder")
    if data_dir.is_dir() and any(data_dir.iterdir()):
        raise InputError(f"{data_dir} is not a PostgreSQL data folder (no PG_VERSION) and not empty; give a new folder")
    if user is not None:
        _check_reachable(data_dir, user)
    created = not data_dir.exists()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        if user is not None:
            os.chown(data_dir, user.pw_uid, user.pw_gid)
        args: list[str | Path] = [bins / "initdb", "-D", data_dir, "-U", SUPERUSER, "-A", "trust", "-E", "UTF8"]
        proc = _run([*args, "--locale=C", "--no-instructions"], user)
        if proc.returncode != 0:
            raise DlindexError(f"initdb failed in {data_dir}: {_last_line(proc.stderr or proc.stdout)}")
        with (data_dir / "postgresql.conf").open("a", encoding="utf-8") as f:
            f.write(_INCLUDE)
    except BaseException:
        if created:  # only a folder made here is removed; initdb empties one it was given
            shutil.rmtree(data_dir, ignore_errors=True)
        raise


def _check_reachable(data_dir: Path, user: pwd.struct_passwd) -> None:
    """Every existing folder above ``data_dir`` must let the server user through (pytest's and
    mkdtemp's folders are 0700 root)."""
    groups = {user.pw_gid, *os.getgrouplist(user.pw_name, user.pw_gid)}
    for folder in [p for p in data_dir.parents if p.exists()]:
        st = folder.stat()
        bit = stat.S_IXUSR if st.st_uid == user.pw_uid else stat.S_IXGRP if st.st_gid in groups else stat.S_IXOTH
        if not st.st_mode & bit:
            raise InputError(
                f"the {user.pw_name} user (PostgreSQL does not run as root) cannot reach {data_dir}: {folder} is "
                f"mode {stat.S_IMODE(st.st_mode):04o}; pick a folder it can reach (e.g. under /tmp or /var/lib/postgresql)"
            )


def _write_conf(data_dir: Path, host: str, port: int, user: pwd.struct_passwd | None) -> None:
    sockets = str(data_dir) if len(f"{data_dir}/.s.PGSQL.{port}") <= _SOCKET_PATH_MAX else "/tmp"
    path = data_dir / CONF_FILE
    path.write_text(
        "# written by dlindex postgres start on every start; put your own settings in postgresql.conf\n"
        f"listen_addresses = '{host}'\nport = {port}\nunix_socket_directories = '{sockets}'\n"
        "shared_preload_libraries = 'pg_stat_statements'\n",
        encoding="utf-8",
    )
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def _settings(data_dir: Path) -> dict[str, str]:
    try:
        return dict(_SETTING.findall((data_dir / CONF_FILE).read_text(encoding="utf-8")))
    except (FileNotFoundError, PermissionError):
        return {}


def _setting_int(data_dir: Path, name: str) -> int | None:
    value = _settings(data_dir).get(name, "").strip()
    return int(value) if value.isdigit() else None


# --- the server -------------------------------------------------------------------------------------


def _start(data_dir: Path, bins: Path, user: pwd.struct_passwd | None, port: int) -> None:
    log = data_dir / LOG_FILE
    offset = log.stat().st_size if log.exists() else 0  # the log grows over starts: read only this one's
    args: list[str | Path] = [bins / "pg_ctl", "start", "-D", data_dir, "-l", log, "-w", "-t", str(START_TIMEOUT_S)]
    proc = _run([*args, "-s"], user)
    if proc.returncode == 0:
        return
    logged = _read_from(log, offset)
    if "Address already in use" in logged:
        raise InputError(f"port {port} is in use; pick another with --port")
    reason = _log_error(logged) or _last_line(proc.stderr or proc.stdout)
    raise DlindexError(f"PostgreSQL in {data_dir} did not start: {reason} (see {log})")


def _status(data_dir: Path, bins: Path, user: pwd.struct_passwd | None) -> PostgresStatus:
    proc = _run([bins / "pg_ctl", "status", "-D", data_dir], user)
    if proc.returncode not in (0, 3):
        raise DlindexError(f"pg_ctl status failed for {data_dir}: {_last_line(proc.stderr or proc.stdout)}")
    host = _settings(data_dir).get("listen_addresses", "127.0.0.1").strip()
    port = _setting_int(data_dir, "port")
    if proc.returncode == 3:
        return PostgresStatus(data_dir, False, None, port, None)
    pid = re.search(r"PID: (\d+)", proc.stdout)
    with contextlib.suppress(OSError, IndexError, ValueError):  # postmaster.pid: line 4 is the port
        port = int((data_dir / "postmaster.pid").read_text().splitlines()[3])
    return PostgresStatus(data_dir, True, int(pid.group(1)) if pid else None, port, _url(host, port) if port else None)


def _ensure_database(bins: Path, host: str, port: int) -> None:
    psql: list[str | Path] = [bins / "psql", "-X", "-q", "-t", "-A", "-h", host, "-p", str(port), "-U", SUPERUSER]
    found = _run([*psql, "-d", "postgres", "-c", _HAS_DATABASE], None)
    if found.returncode == 0 and found.stdout.strip() != "1":
        found = _run([*psql, "-d", "postgres", "-c", _CREATE_DATABASE], None)
    if found.returncode != 0:
        raise DlindexError(f"could not create the database {DATABASE}: {_last_line(found.stderr)}")


def _url(host: str, port: int) -> str:
    return f"postgresql://{SUPERUSER}@{f'[{host}]' if ':' in host else host}:{port}/{DATABASE}"


# --- programs, users, ports -------------------------------------------------------------------------


def _candidate_bindirs() -> list[Path]:
    found: list[Path] = []
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True)
            found.append(Path(out.stdout.strip()))
    if pg_ctl := shutil.which("pg_ctl"):
        found.append(Path(pg_ctl).resolve().parent)  # /usr/local/bin/pg_ctl may link into the real bindir
    versioned = glob.glob(_VERSIONED_BINDIRS)
    found.extend(Path(p) for p in sorted(versioned, key=_major_version, reverse=True))
    return found


def _major_version(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.name))


def _has_programs(folder: Path) -> bool:
    return all(os.access(folder / name, os.X_OK) and (folder / name).is_file() for name in PROGRAMS)


def _server_user() -> pwd.struct_passwd | None:
    """The OS user to run the server programs as: None for ourselves, the postgres user under root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise InputError(
            f"PostgreSQL does not run as root, and there is no {SERVER_USER} OS user to run it as; "
            f"create one (useradd --system {SERVER_USER}) or run as a normal user"
        ) from None


def _run(args: list[str | Path], user: pwd.struct_passwd | None) -> subprocess.CompletedProcess[str]:
    # PG* variables (PGDATA, PGPORT, PGHOST...) of the caller must not redirect the programs
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    ids: dict[str, Any] = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    try:
        return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd="/",
                              stdin=subprocess.DEVNULL, timeout=START_TIMEOUT_S + 30, **ids)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DlindexError(f"{Path(str(args[0])).name} did not finish within {START_TIMEOUT_S + 30} s") from None
    except OSError as e:
        raise DlindexError(f"cannot run {args[0]}: {e.strerror}") from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _free_port(host: str) -> int:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # as the postmaster binds: a port left in TIME_WAIT by the last stop is free, a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _read_from(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _log_error(logged: str) -> str | None:
    """The last FATAL line of server log text, with the complaint before it ("invalid value...")."""
    lines = [line.strip() for line in logged.splitlines()]
    fatal = [n for n, line in enumerate(lines) if "FATAL:" in line]
    if not fatal:
        return None
    message = lines[fatal[-1]].split("FATAL:", 1)[1].strip()
    causes = [line[m.end(1) + 1 :].strip() for line in lines[: fatal[-1]] if (m := _CAUSE.search(line))]
    return f"{message}: {causes[-1]}" if causes else message
