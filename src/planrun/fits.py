"""Contract fits kept between processes (issue 16).

A check that found a tool's schema to be a valid JSON Schema 2020-12 (:func:`planrun.
registry.schema_problems`), or a step's arguments to fit their tool's contract
(:func:`planrun.validation.arguments.argument_problems`), gives the same verdict every
time for the same input and the same checker. The nightly run of an unchanged plan, and a
``resume`` of a run whose registry has not changed, would import jsonschema (about a third
of a process's start-up) only to learn those fits again. So planrun keeps them, and only
them, in a file:

- **Where**: ``platformdirs.user_cache_path("planrun")`` (e.g. ``~/.cache/planrun/``),
  ``fits-CHECKER.txt``, one SHA-256 (hex) a line. Used only in a folder of this user that
  nobody else may write (as the CEL parser cache, :mod:`planrun.conditions`); elsewhere,
  or on any error reading or writing it, nothing is kept and every check runs.
- **What a line is**: the SHA-256 of what was checked — ``schema`` and the schema's JSON
  text, or ``arguments``, the tool's ``contract_key`` and the arguments' JSON text or shape
  — so another schema, contract, entry or value is another line.
- **CHECKER** names the code that gives verdicts: the Python version and the size and
  modification time of every file of planrun, jsonschema, jsonschema-specifications,
  referencing and RE2. An upgrade or an edit of any of them starts a new file (the old
  ones are removed), so no verdict outlives the code that gave it.
- **Only fits**: a problem is never kept; it is worked out again, with its message, every
  time. A line that is not 64 hex digits is ignored, so a torn or damaged file can only
  cost a check, never skip one. The file is started afresh past :data:`MAX_BYTES`, and
  only a regular file is read or written (not through a symlink, never a FIFO or device).
- **Not kept** (:func:`planrun.validation.arguments.argument_problems`): fits of a contract
  that uses ``format`` (jsonschema asserts most formats only when an optional package is
  installed), and fits keyed by the value of arguments that hold a secret (the hash would
  let a reader of the file confirm a guess).

Lines learnt are appended when validation ends (:func:`save`, called by ``check_plan``) and
when the process exits, with one ``write`` on a file opened for appending, so processes
running at once do not overwrite each other's lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Past this size (bytes) the file is started afresh (about 130,000 fits).
MAX_BYTES = 8 * 1024 * 1024
#: The packages whose code decides a verdict (import names).
CHECKER_PACKAGES = ("planrun", "jsonschema", "jsonschema_specifications", "referencing",
                    "re2")

_LINE = re.compile(r"[0-9a-f]{64}")

#: The fits read from the file (None: not read yet), and those learnt since the last save.
_known: set[str] | None = None
_learnt: list[str] = []
_path: Path | None = None
#: The cache folder ``_known`` was read from.
_read_in: Path | None = None
_registered = False


def _stamp(h: Any, folder: str) -> None:
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        stack.append(entry.path)
                    continue
                if entry.name.endswith((".pyc", ".pyo")):
                    continue
                st = entry.stat()
                h.update(f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode(
                    "utf-8", "surrogateescape"))


@lru_cache(maxsize=1)
def checker() -> str:
    """The identity of the code that gives verdicts: 16 hex digits (see the module).

    Worked out once a process: the code a process runs is the code it loaded.

    Raises:
        OSError: a package folder cannot be listed.
    """
    from importlib.util import find_spec

    h = hashlib.sha256(sys.version.encode())
    for name in CHECKER_PACKAGES:
        spec = find_spec(name)
        h.update(f"\0{name}\0".encode())
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            for folder in sorted(spec.submodule_search_locations):
                _stamp(h, folder)
        else:
            st = os.stat(spec.origin)
            h.update(f"{spec.origin}\0{st.st_size}\0{st.st_mtime_ns}\n".encode(
                "utf-8", "surrogateescape"))
    return h.hexdigest()[:16]


#: (the environment the cache folder depends on, the folder): platformdirs takes ~12 µs,
#: and a fan-out item whose arguments are checked by value asks for every item.
_folder_of: tuple[tuple[str | None, ...], Path | None] | None = None


def _folder() -> Path | None:
    """The user cache folder (:func:`planrun.paths.user_cache_folder`; None: no home)."""
    global _folder_of
    env = (os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"),
           os.environ.get("LOCALAPPDATA"))
    if _folder_of is None or _folder_of[0] != env:
        from .paths import user_cache_folder

        _folder_of = (env, user_cache_folder())
    return _folder_of[1]


def _file(folder: Path) -> Path | None:
    """The fits file of this checker in ``folder`` (made); None when none may be used."""
    from .paths import private_dir

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not private_dir(folder):
        return None
    path = folder / f"fits-{checker()}.txt"
    if not path.exists():
        for old in folder.glob("fits-*.txt"):  # another checker's: its verdicts are void
            if old.name != path.name:  # this one may have just been made by a process
                with contextlib.suppress(OSError):  # running at once: its lines are kept
                    old.unlink()
    return path


def _load() -> set[str]:
    global _known, _path, _read_in
    folder = _folder()
    if _known is not None and folder == _read_in:
        return _known
    save()  # the cache folder changed (HOME did, in a long-lived process): the old first
    _known, _path, _read_in = set(), None, folder
    if folder is None:
        return _known
    try:
        _path = _file(folder)
        if _path is None:
            return _known
        text = _read(_path)
    except FileNotFoundError:
        return _known
    except (OSError, ValueError):
        _path = None
        return _known
    if text is None:  # past its size: started afresh
        with contextlib.suppress(OSError):
            _path.unlink()
        return _known
    _known.update(line for line in text.split("\n") if _LINE.fullmatch(line))
    return _known


#: How the file is opened: never through a symlink, never waiting (a FIFO put there).
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read(path: Path) -> str | None:
    """The file's text; None when it is past :data:`MAX_BYTES`.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (a FIFO, a device, a
            symlink: ``ELOOP``), which is never read.
    """
    import stat

    fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > MAX_BYTES:
            return None
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    return None if len(data) > MAX_BYTES else data.decode("ascii", "replace")


def key(*parts: str) -> str:
    """The line for a check of ``parts`` (kind first): SHA-256 hex of them, NUL-joined."""
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


def known(line: str) -> bool:
    """Whether a process of this checker found this fit before (see :func:`key`)."""
    return line in _load()


def learn(line: str) -> None:
    """Keep a fit found now; written by the next :func:`save` (or at exit)."""
    global _registered
    found = _load()
    if line in found:
        return
    found.add(line)
    _learnt.append(line)
    if not _registered:
        import atexit

        atexit.register(save)
        _registered = True


def save() -> None:
    """Append the fits learnt since the last save to the file; errors are ignored."""
    if not _learnt or _path is None:
        _learnt.clear()
        return
    data = "".join(f"{line}\n" for line in _learnt).encode("ascii")
    _learnt.clear()
    import stat

    with contextlib.suppress(OSError):
        fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _OPEN_FLAGS, 0o600)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, data)
        finally:
            os.close(fd)


def reset() -> None:
    """Forget what was read and learnt in this process (tests)."""
    global _known, _path, _read_in
    _known = _path = _read_in = None
    _learnt.clear()
