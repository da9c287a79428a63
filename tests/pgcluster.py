"""A throw-away PostgreSQL cluster for the tests: a Unix socket only, removed at the end.

``Cluster.start()`` finds the server binaries (``/usr/lib/postgresql/*/bin``, then
``pg_config --bindir``, then ``PATH``), runs ``initdb`` into a fresh temporary folder and
starts the server with ``listen_addresses=''`` (no TCP port) and its socket in that
folder. As root (``initdb`` refuses root) the server runs as the unprivileged ``postgres``
user (or ``nobody``) through ``runuser``/``su``. ``Cluster.database()`` creates a fresh,
empty database and returns its journal URL. ``Cluster.stop()`` stops the server and
removes the folder.

The server runs with ``fsync=off``: the tests kill planrun processes, not the server
(a server restart with ``pg_ctl restart -m fast`` still writes everything).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def server_bindir() -> Path | None:
    """The folder of ``initdb``/``pg_ctl``/``postgres``, or None when no server is installed."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: [int(x) if x.isdigit() else 0
                                       for x in Path(p).parent.name.split(".")])
    candidates.reverse()
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            candidates.append(out)
    on_path = shutil.which("postgres")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if all((Path(folder) / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    return None


def _server_user() -> str | None:
    """The unprivileged user the server runs as when we are root (None: ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and no unprivileged user (postgres, nobody) exists")


@dataclass
class Cluster:
    """One throw-away server (see the module doc)."""

    bindir: Path
    root: Path
    user: str | None

    @property
    def sock(self) -> Path:
        return self.root / "sock"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(a) for a in argv]
        if self.user is not None:
            runuser = shutil.which("runuser")
            cmd = ([runuser, "-u", self.user, "--", *cmd] if runuser
                   else ["su", self.user, "-s", "/bin/sh", "-c",
                         " ".join(f"'{c}'" for c in cmd)])
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                check=False, cwd="/")
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n"
                               f"{result.stdout}\n{result.stderr}")
        return result

    @classmethod
    def start(cls, bindir: Path, *, durable: bool = False) -> Cluster:
        """Start a new cluster; ``durable``: with ``fsync`` (benchmarks), else without."""
        user = _server_user()
        root = Path(tempfile.mkdtemp(prefix="planrun-pg-"))
        cluster = cls(bindir=bindir, root=root, user=user)
        (root / "sock").mkdir()
        if user is not None:
            info = pwd.getpwnam(user)
            for p in (root, root / "sock"):
                os.chown(p, info.pw_uid, info.pw_gid)
        try:
            cluster._run(str(bindir / "initdb"), "-D", str(root / "data"), "-A", "trust",
                         "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
            cluster._run(str(bindir / "pg_ctl"), "-D", str(root / "data"), "-l",
                         str(root / "log"), "-w", "-t", "60", "-o",
                         f"-k {root / 'sock'} -c listen_addresses='' "
                         + ("" if durable else "-c fsync=off -c full_page_writes=off ")
                         + "-c max_connections=200", "start")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def url(self, dbname: str) -> str:
        """The journal URL of database ``dbname`` (socket only, user ``postgres``)."""
        return f"postgresql:///{dbname}?host={self.sock}&user=postgres"

    def database(self, label: str = "t") -> str:
        """A fresh empty database; its journal URL."""
        import psycopg

        name = f"planrun_{''.join(c if c.isalnum() else '_' for c in label)[:30]}_" \
               f"{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def restart(self) -> None:
        """Stop the server (fast: connections are cut) and start it again."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-w",
                  "-l", str(self.root / "log"), "-m", "fast", "restart", "-o",
                  f"-k {self.sock} -c listen_addresses='' -c fsync=off "
                  "-c full_page_writes=off -c max_connections=200")

    def stop(self) -> None:
        """Stop the server (immediately) and remove everything of it."""
        if (self.root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-w",
                          "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
