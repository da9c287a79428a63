"""Project discovery and settings (SPEC §1).

The *project folder* is ``-C/--project DIR``, else ``$PLANRUN_PROJECT``, else the nearest
folder from the current one upwards that holds ``planrun.toml``, else the current folder.
``plans_dir`` and ``registry`` are relative to it. Precedence for every setting:
command-line flag > environment (``PLANRUN_JOURNAL``, ``PLANRUN_PROJECT``) > ``planrun.toml``
> default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import childenv
from .errors import Refused, UsageError
from .issues import Issue, Report, did_you_mean

#: The file endings of a plan, in the order ``plans/NAME`` tries them.
PLAN_SUFFIXES = (".yaml", ".yml", ".json")

CONFIG_NAME = "planrun.toml"
_KEYS = {"plans_dir", "registry", "journal", "max_parallel", "max_steps", "policy", "pools",
         "planners", "executor", "dask"}
#: Keys of ``[dask]`` in planrun.toml (the cluster ``--executor dask`` starts).
_DASK_KEYS = {"workers", "threads_per_worker"}


def private_dir(folder: Path) -> bool:
    """Whether ``folder`` is a directory of this user that nobody else may write.

    The rule for every file planrun keeps in a cache folder (a pickle, a verdict): one
    another user could write is never read.
    """
    import stat

    try:
        st = folder.stat()
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


#: What platformdirs raises when this user has no home folder it can find (``HOME`` unset
#: or relative and no ``/etc/passwd`` entry: a container run as ``--user N``).
_NO_HOME = (RuntimeError, KeyError, OSError)


def default_journal() -> Path:
    """``platformdirs.user_data_path("planrun") / "journal.sqlite3"``.

    Raises:
        JournalError: there is no home folder to put it in (exit 6).
    """
    import platformdirs

    try:
        return Path(platformdirs.user_data_path("planrun")) / "journal.sqlite3"
    except _NO_HOME as exc:
        from .errors import JournalError

        raise JournalError(f"no default journal location: {exc}",
                           hint="Name one with --journal PATH, PLANRUN_JOURNAL or journal = "
                           "in planrun.toml, or set HOME.") from None


def user_cache_folder() -> Path | None:
    """``platformdirs.user_cache_path("planrun")``; None when this user has no home folder.

    Every cache planrun keeps (contract fits, parsed YAML, the CEL parser) is then simply
    not kept: a check or a parse costs its time, never an error.
    """
    import platformdirs

    try:
        return Path(platformdirs.user_cache_path("planrun"))
    except _NO_HOME:
        return None


def probe(path: Path, test: str = "exists") -> bool:
    """``path.exists()`` (or ``is_file``/``is_dir``), False for a path the OS cannot look at.

    A user's path that is too long for the file system (``ENAMETOOLONG``), holds a NUL, or
    cannot be examined (``EACCES`` on a parent) is "not there", never an exception.
    """
    try:
        return bool(getattr(path, test)())
    except (OSError, ValueError):
        return False


def present(path: Path) -> bool:
    """Whether anything is at ``path``: a file of any kind, a folder, a dangling symlink.

    What a user's path names even when it cannot be read (:func:`probe` says no for a
    dangling symlink): such a thing is reported for what it is, never passed over.
    """
    return probe(path, "is_symlink") or probe(path)


#: The first 16 bytes of every SQLite database file (a journal is one).
SQLITE_HEADER = b"SQLite format 3\x00"
#: The files SQLite keeps beside a database while it is used (WAL, shared memory, rollback).
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


def _sqlite_database(path: str) -> bool:
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never opens a FIFO (it would block)
            return False
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except (OSError, ValueError):
        return False


def refuse_database(path: str | os.PathLike[str]) -> None:
    """Raise :class:`OSError` when writing a file at ``path`` would replace a journal.

    A page or a plan that planrun writes where the user said (``report --out``,
    ``plan --out``, ``import --out``) never replaces an SQLite database (a journal: the
    one in use or another) or one of the files SQLite keeps beside it, also not through a
    symlink: ``planrun report --out journal.sqlite3`` wrote the page over the whole
    history (found by an attacker). Callers turn the error into their usage error.
    """
    real = os.path.realpath(path)
    sidecar = next((s for s in SQLITE_SIDECARS if real.endswith(s)), None)
    if _sqlite_database(real) or (sidecar is not None
                                  and _sqlite_database(real[:-len(sidecar)])):
        raise OSError(0, "it is an SQLite database (a journal?) or one of its files; "
                      "planrun never writes over one")


def find_config(start: Path) -> Path | None:
    """The nearest ``planrun.toml`` in ``start`` or its parents, or None.

    Whatever is there counts, a FIFO, a folder or a dangling symlink too: reading it then
    fails with code ``config`` (:func:`load_settings`) rather than a parent folder's
    settings or none being used without a word.
    """
    for folder in (start, *start.parents):
        candidate = folder / CONFIG_NAME
        if present(candidate):
            return candidate
    return None


@dataclass(eq=False)
class Settings:
    """Resolved settings of one invocation.

    Attributes:
        project: the project folder (absolute).
        config_file: the ``planrun.toml`` that was read, or None.
        plans_dir: folder of plan files (absolute).
        registry: path of ``tools.yaml`` (absolute).
        journal: the journal's location: an absolute path (an SQLite file), or a URL
            kept as given (``scheme://…``; see :func:`journal_location`).
        max_parallel: calls running at once (default 4).
        max_steps: the most steps a plan may have (default 500).
        policy: the raw ``[policy]`` table (checked by ``planrun.policy``).
        pools: ``[pools]`` NAME → limit.
        planners: the raw ``[planners]`` table (checked by ``planrun.planners``).
        executor: where calls run (SPEC §12): ``local``, ``dask`` (a local Dask cluster
            started for the run) or ``dask:tcp://HOST:PORT`` (see :func:`parse_executor`).
        dask: ``[dask]``: ``workers`` and ``threads_per_worker`` of the local Dask cluster.
    """

    project: Path
    config_file: Path | None
    plans_dir: Path
    registry: Path
    journal: Path | str
    max_parallel: int = 4
    max_steps: int = 500
    policy: dict[str, Any] = field(default_factory=dict)
    pools: dict[str, int] = field(default_factory=dict)
    planners: dict[str, Any] = field(default_factory=dict)
    executor: str = "local"
    dask: dict[str, int] = field(default_factory=dict)


def parse_executor(value: str) -> str:
    """``--executor`` / ``executor =``, checked: ``local``, ``dask`` or ``dask:ADDRESS``.

    ADDRESS is a Dask scheduler's ``tcp://HOST:PORT`` (``tls://`` too; a bare
    ``HOST:PORT`` means ``tcp://``), PORT 1-65535. Returns the canonical spelling.

    Raises:
        ValueError: any other value; the message says what is accepted.
    """
    text = value.strip()
    if text in ("local", "dask"):
        return text
    kind, sep, address = text.partition(":")
    if kind == "dask" and sep:
        if "://" not in address:
            address = "tcp://" + address
        scheme, _, rest = address.partition("://")
        host, colon, port = rest.rpartition(":")
        if scheme in ("tcp", "tls") and colon and host and "/" not in rest \
                and port.isdigit() and 0 < int(port) < 65536:
            return f"dask:{scheme}://{host}:{port}"
    raise ValueError(f"unknown executor {value!r}: use local, dask (a local Dask cluster "
                     "for the run) or dask:tcp://HOST:PORT (a Dask scheduler)")


def shown_path(path: Path) -> str:
    """``path`` relative to the current folder when it is inside it, else as it is.

    Relative paths are what GitHub annotations and people expect.
    """
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        text = str(path)
    return printable(text)


def printable(text: str) -> str:
    """``text`` printable as UTF-8.

    Undecodable bytes of a file name (lone surrogates) become backslash escapes
    (:func:`planrun.loading.utf8_text`).
    """
    from .loading import utf8_text

    return utf8_text(text)


def _config_error(file: Path, message: str) -> Refused:
    issue = Issue(code="config", message=message, file=shown_path(file))
    return Refused(f"{file}: {message}", code="config", report=Report(issues=[issue]))


def _positive_int(raw: dict[str, Any], key: str, default: int, file: Path) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _config_error(file, f"{key} must be an integer >= 1, not {value!r}")
    return value


def load_settings(project: str | Path | None = None, journal: str | Path | None = None,
                  cwd: Path | None = None) -> Settings:
    """Resolve the settings of one invocation.

    Args:
        project: ``-C/--project`` (None: environment, then discovery).
        journal: ``--journal`` (None: environment, then ``planrun.toml``, then default).
        cwd: the folder to discover from (default: the current folder).

    Raises:
        UsageError: ``-C`` names no folder (exit 2).
        Refused: ``planrun.toml`` is unreadable or invalid (code ``config``, exit 3).
    """
    here = (cwd or Path.cwd()).resolve()
    explicit = project if project is not None else os.environ.get("PLANRUN_PROJECT") or None
    if explicit is not None:
        folder = (here / Path(explicit).expanduser()).resolve()
        if not probe(folder, "is_dir"):
            raise UsageError(f"project folder {str(explicit)!r} does not exist",
                             hint="Give -C/--project an existing folder.")
        config_file: Path | None = folder / CONFIG_NAME
        if config_file is not None and not present(config_file):
            config_file = None
    else:
        config_file = find_config(here)
        folder = config_file.parent if config_file else here
    raw: dict[str, Any] = {}
    if config_file is not None:
        import tomllib

        from .loading import DocumentError, read_text

        try:
            raw = tomllib.loads(read_text(config_file, str(config_file)))
        except DocumentError as exc:
            raise _config_error(config_file, exc.issues[0].message) from None
        except tomllib.TOMLDecodeError as exc:
            raise _config_error(config_file, f"not valid TOML: {exc}") from None
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            hint = "".join(did_you_mean(u, _KEYS) for u in unknown)
            raise _config_error(config_file, f"unknown setting(s) {', '.join(unknown)}; "
                                f"known: {', '.join(sorted(_KEYS))}.{hint}")
        for key in ("plans_dir", "registry", "journal"):
            if key in raw and not isinstance(raw[key], str):
                raise _config_error(config_file, f"{key} must be a string path")
        for key in ("policy", "pools", "planners", "dask"):
            if key in raw and not isinstance(raw[key], dict):
                raise _config_error(config_file, f"[{key}] must be a table")
    cfg_file = config_file or folder / CONFIG_NAME
    pools: dict[str, int] = {}
    for name, limit in (raw.get("pools") or {}).items():
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _config_error(cfg_file, f"pool {name!r} must be an integer >= 1")
        pools[name] = limit
    executor = raw.get("executor", "local")
    try:
        if not isinstance(executor, str):
            raise ValueError(f"executor must be a string, not {executor!r}")
        executor = parse_executor(executor)
    except ValueError as exc:
        raise _config_error(cfg_file, str(exc)) from None
    dask = raw.get("dask") or {}
    unknown_dask = sorted(set(dask) - _DASK_KEYS)
    if unknown_dask:
        raise _config_error(cfg_file, f"unknown [dask] setting(s) {', '.join(unknown_dask)}; "
                            f"known: {', '.join(sorted(_DASK_KEYS))}")
    dask = {k: _positive_int(dask, k, 1, cfg_file) for k in dask}
    if journal is not None:
        journal_at = journal_location(journal, here)
    elif childenv.getenv("PLANRUN_JOURNAL"):  # also while hidden from children
        journal_at = journal_location(childenv.getenv("PLANRUN_JOURNAL") or "", here)
    elif "journal" in raw:
        journal_at = journal_location(raw["journal"], folder, resolve=False)
    else:
        journal_at = default_journal()
    childenv.note_journal(journal_at)  # a PostgreSQL journal's PGPASSWORD: not for children
    return Settings(
        project=folder,
        config_file=config_file,
        plans_dir=folder / raw.get("plans_dir", "plans"),
        registry=folder / raw.get("registry", "tools.yaml"),
        journal=journal_at,
        max_parallel=_positive_int(raw, "max_parallel", 4, cfg_file),
        max_steps=_positive_int(raw, "max_steps", 500, cfg_file),
        policy=raw.get("policy") or {},
        pools=pools,
        planners=raw.get("planners") or {},
        executor=executor,
        dask=dask,
    )


def is_url(location: str | Path) -> bool:
    """Whether a journal location is a URL (``scheme://…``) rather than a file path."""
    if isinstance(location, Path):
        return False
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme[:1].isalpha() and all(
        c.isalnum() or c in "+.-" for c in scheme)


def journal_location(given: str | Path, base: Path, *, resolve: bool = True) -> Path | str:
    """A journal location as given (``--journal``, ``PLANRUN_JOURNAL``, ``journal =``).

    A URL stays text, exactly as given (``Path`` would fold its ``//``); which URL schemes
    can be used is decided when the journal is opened (``planrun.journal.backends``). A
    path is made absolute: ``~`` expanded, a relative one taken from ``base`` (the current
    folder for the flag and the environment, the project folder for ``planrun.toml``),
    and with ``resolve`` resolved (symlinks, ``..``).
    """
    if is_url(given):
        return str(given)
    path = Path(given).expanduser()
    if path.is_absolute():
        return path
    return (base / path).resolve() if resolve else base / path


class PlanLookupError(Exception):
    """A plan name that cannot be used: ``issue`` has code ``not_found`` or ``bad_name``."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(issue.message)
        self.issue = issue


def plan_names(plans_dir: Path) -> list[str]:
    """Names of the plans in ``plans_dir``, sorted."""
    if not probe(plans_dir, "is_dir"):
        return []
    try:
        return sorted({p.stem for p in plans_dir.iterdir()
                       if probe(p, "is_file") and p.suffix in PLAN_SUFFIXES})
    except OSError:  # unreadable folder
        return []


def _refuse_not_regular(candidate: Path, shown: str) -> None:
    """PlanLookupError when ``candidate`` is there but a FIFO, a device or a socket.

    Such a file is never opened (a FIFO would be waited on); a folder is just not a plan.
    """
    if probe(candidate) and not probe(candidate, "is_dir"):
        raise PlanLookupError(Issue(
            code="not_found", file=shown,
            message=f"the plan file {candidate} is not a regular file (a FIFO, a device or "
            "a socket)"))


def find_plan(name: str, plans_dir: Path, cwd: Path | None = None) -> Path:
    r"""The file for plan ``name`` (SPEC §3 "Plan lookup").

    ``plans/NAME.yaml``, ``.yml``, ``.json`` are tried in that order. A name holding ``/``,
    ``\\`` or ``..`` is refused (``bad_name``) unless it is an existing file path.

    Raises:
        PlanLookupError: ``not_found`` (message lists the plans that exist) or ``bad_name``.
    """
    here = cwd or Path.cwd()
    shown = printable(name)
    if "/" in name or "\\" in name or ".." in name:
        candidate = here / name
        if probe(candidate, "is_file"):
            return candidate
        _refuse_not_regular(candidate, shown)
        raise PlanLookupError(Issue(
            code="bad_name", file=shown,
            message=f"plan name {shown!r} may not contain '/', '\\' or '..' (a plan is "
            f"looked up by name in {plans_dir}); give an existing file path to run a plan "
            "from elsewhere"))
    candidates = [plans_dir / f"{name}{suffix}" for suffix in PLAN_SUFFIXES]
    if name.endswith(PLAN_SUFFIXES):
        candidates.insert(0, plans_dir / name)
    for candidate in candidates:
        if probe(candidate, "is_file"):
            return candidate
    for candidate in candidates:
        _refuse_not_regular(candidate, shown)
    existing = plan_names(plans_dir)
    if not probe(plans_dir, "is_dir"):
        raise PlanLookupError(Issue(
            code="not_found", file=shown,
            message=f"no plan named {shown!r}: there is no plans folder at {plans_dir}. "
            "Run planrun in a project folder, name one with -C DIR, or create one with "
            "planrun init"))
    hint = did_you_mean(name, existing)
    listing = ", ".join(existing) if existing else "none"
    raise PlanLookupError(Issue(
        code="not_found", file=shown,
        message=f"no plan named {shown!r} in {plans_dir}.{hint} Plans: {listing}"))
