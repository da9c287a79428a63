"""Parsed YAML documents kept between processes (issue 16).

Reading a YAML file gives the same JSON data every time for the same text and the same
parser. A nightly run of an unchanged plan, a ``resume`` (which reads ``tools.yaml``
again) and CI validating the same plan would each import PyYAML (about 7 ms of a
process's start) and parse the text again (a 10,000-step plan: ~190 ms, against ~7 ms
to read the same data as JSON). So planrun keeps the data of a YAML plan or registry it
parsed, as JSON, keyed by the text's SHA-256:

- **Where**: the user cache folder of :mod:`planrun.fits` (``~/.cache/planrun/`` on
  Linux), ``parsed-PARSER-SHA256.json``, one file per document; used only in a folder of
  this user that nobody else may write. On any error reading or writing, nothing is kept
  and the text is parsed.
- **PARSER** names the code that parses: :func:`planrun.fits.checker` (the Python version
  and every file of planrun and the contract libraries) and every file of PyYAML. An
  upgrade or an edit starts new files; the others are removed when the next one is
  written.
- **What a file is**: a first line with the SHA-256 (hex) of the rest, then the data as
  compact JSON. A file whose rest does not match its first line (damaged, torn) is
  ignored and written again: it can only cost a parse, never change what is read. Only a
  regular file is read (never through a symlink, never a FIFO or device).
- **Only what parsed cleanly**: a text with an error is parsed (and its issues found)
  every time. **Never kept**: a document with a YAML anchor (``&``: its aliases are shared
  objects, which JSON would copy), a plan that declares a ``secret`` parameter (its
  ``default`` may be a secret's value, which lives only in the process's memory, SPEC
  §7), parameter files (``--params-file``: never asked to keep), and a document over
  :data:`MAX_BYTES` of JSON.
- **Bounded**: at most :data:`MAX_FILES` files (the least recently written go first). A
  write goes to a temporary file renamed into place; one that fails removes it, and one a
  killed writer left is removed by a later write once older than :data:`STALE_TMP_S`.

The data read back is the data the parse gave: the same keys in the same order, the same
numbers (JSON keeps a float's shortest ``repr``), the same strings. Issues are located in
the text as before (the YAML is composed only when an issue needs a line).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

#: A document whose JSON is larger than this (bytes) is not kept.
MAX_BYTES = 32 * 1024 * 1024
#: Files kept at most; the oldest (by modification time) are removed past it.
MAX_FILES = 64
#: A temporary file this old (seconds) is a killed writer's: the next write removes it.
STALE_TMP_S = 60.0

#: What :func:`get` gives when nothing is kept for a text.
MISSING: Any = object()

_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DATA_TEXT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@lru_cache(maxsize=1)
def parser() -> str:
    """The identity of the code that parses: 16 hex digits (see the module).

    Raises:
        OSError: a package folder cannot be listed.
    """
    from importlib.util import find_spec

    from .fits import _stamp, checker

    h = hashlib.sha256(checker().encode())
    spec = find_spec("yaml")
    for folder in sorted((spec.submodule_search_locations or []) if spec else []):
        _stamp(h, folder)
    return h.hexdigest()[:16]


def _folder() -> Path | None:
    """The cache folder (made), or None when none may be used."""
    from .fits import _folder as cache_folder
    from .paths import private_dir

    folder = cache_folder()
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder if private_dir(folder) else None


def _name(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"parsed-{parser()}-{digest}.json"


def keepable(text: str, data: Any) -> bool:
    """Whether the data of ``text`` may be kept (see the module: anchors, secrets)."""
    if "&" in text:
        return False
    params = data.get("params") if isinstance(data, dict) else None
    if isinstance(params, dict):
        return not any(isinstance(p, dict) and p.get("secret") for p in params.values())
    return True


def get(text: str) -> tuple[Path | None, Any]:
    """(the file kept for ``text``, its data), the data :data:`MISSING` when none is kept.

    The file is None when no cache folder may be used. Give it to :func:`put` after a
    parse: the text is hashed and the folder looked at once.
    """
    try:
        folder = _folder()
        if folder is None:
            return None, MISSING
        path = folder / _name(text)
    except (OSError, ValueError):
        return None, MISSING
    try:
        raw = _read(path)
    except OSError:  # not a regular file (a FIFO, a symlink): replaced by the next put
        return path, MISSING
    if raw is None:
        return path, MISSING
    check, _, body = raw.partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode("ascii") != check:
        return path, MISSING
    try:
        return path, json.loads(body)
    except (ValueError, RecursionError):  # not one this code wrote
        return path, MISSING


def _read(path: Path) -> bytes | None:
    """The file's bytes; None when it is not there or is past :data:`MAX_BYTES`.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (never read).
    """
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > MAX_BYTES + 65:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def put(path: Path, text: str, data: Any) -> None:
    """Keep at ``path`` (from :func:`get`) the data ``text`` parsed to; errors are ignored.

    Only when :func:`keepable`.
    """
    if not keepable(text, data):
        return
    with contextlib.suppress(OSError, ValueError, TypeError, RecursionError):
        body = _DATA_TEXT.encode(data).encode("utf-8", "surrogatepass")
        if len(body) > MAX_BYTES:
            return
        folder, name = path.parent, path.name
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS, 0o600)
        try:
            try:
                os.write(fd, hashlib.sha256(body).hexdigest().encode("ascii") + b"\n")
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, folder / name)
        except BaseException:  # a full disk, a folder in its place: no partial file stays
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _prune(folder, name)


def _prune(folder: Path, kept: str) -> None:
    """Remove other parsers' files, the oldest past :data:`MAX_FILES`, and stale temps.

    A temporary file older than :data:`STALE_TMP_S` is what a killed writer left.
    """
    import time

    mine = f"parsed-{parser()}-"
    ours: list[tuple[float, Path]] = []
    for path in folder.glob("parsed-*.json"):
        with contextlib.suppress(OSError):
            if not path.name.startswith(mine):
                path.unlink()
            elif path.name != kept:
                ours.append((path.stat().st_mtime, path))
    stale = time.time() - STALE_TMP_S
    for path in folder.glob(".parsed-*.tmp"):
        with contextlib.suppress(OSError):
            if path.lstat().st_mtime < stale:
                path.unlink()
    ours.sort()
    for _mtime, path in ours[:max(0, len(ours) + 1 - MAX_FILES)]:
        with contextlib.suppress(OSError):
            path.unlink()
