"""Python tools of the ``checksum-tree`` plan (``plans/checksum-tree.yaml``).

Registered in ``tools.yaml`` as ``tree_tools:FUNC``; planrun imports this module with the
registry's folder (the repository root) on ``sys.path`` and calls each function with its
validated arguments as keyword arguments.

The plan lists the regular files under a directory (:func:`list_files`), hashes each one in
a fan-out step (:func:`file_sha256`, one call per file) and writes a report
(:func:`write_report`) in the format of GNU ``sha256sum``: one line per file,
``<64 hex digits><two spaces><path relative to the root>``, sorted by path, so that::

    cd ROOT && sha256sum --check REPORT

verifies the tree. Paths in the report are relative on purpose: the report then also checks
a copy of the tree elsewhere (a restored backup, another machine), and it is exactly what
``cd ROOT && sha256sum FILE...`` would print. A JSON summary is written next to it, as
``<report>.json``.

Paths: planrun runs every tool in the project folder (it changes into it for the run), so
a relative ``root`` or ``report`` is taken from the project folder, not from the folder the
command was typed in. :func:`list_files` and :func:`write_report` return absolute paths
and every later step uses those: the fan-out items, and the verify command, which changes
into ``root`` (``env -C``) before ``sha256sum --check`` because the report's paths are
relative to it. An absolute path can also never be mistaken for a command-line option.

File names: the journal stores outputs as UTF-8 JSON, so a file name that is not valid
UTF-8 cannot be carried from one step to the next unchanged; :func:`list_files` refuses such
a tree with an error naming the file instead of dropping or mangling the name.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn, TypedDict

#: Bytes read at a time while hashing.
_CHUNK = 1 << 20
#: Characters that GNU ``sha256sum`` escapes in a file name (the line then starts with ``\``).
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}


class FileEntry(TypedDict):
    """One regular file found by :func:`list_files`."""

    path: str
    bytes: int


class Listing(TypedDict):
    """Output of :func:`list_files`."""

    root: str
    files: list[FileEntry]
    count: int


class FileDigest(TypedDict):
    """Output of :func:`file_sha256` (one fan-out item)."""

    path: str
    sha256: str
    bytes: int


class Summary(TypedDict):
    """Content of ``<report>.json`` and output of :func:`write_report`."""

    root: str
    report: str
    count: int
    total_bytes: int
    generated_at: str


def _raise(exc: OSError) -> NoReturn:
    """``os.walk`` error handler: an unreadable directory fails the listing."""
    raise exc


def _require_utf8(path: str) -> None:
    """Refuse a path whose name is not valid UTF-8 (it cannot cross the journal intact)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"file name {os.fsencode(path)!r} is not valid UTF-8: planrun "
                         "passes paths between steps as UTF-8 JSON; rename the file or "
                         "choose a pattern that excludes it") from None


def list_files(root: str, pattern: str = "*", exclude: Sequence[str] = ()) -> Listing:
    """List the regular files under a directory, recursively, sorted by path.

    Only regular files count: symbolic links are skipped (whether they point to a file, a
    directory or nowhere; a linked directory is not entered), and so are FIFOs, sockets
    and device files. Hidden files are included. ``pattern`` is matched against the file's
    name (not its folder), case-sensitively, like ``find -name``. Nothing is written.

    Args:
        root: the directory to list (a relative path is taken from the current working
            directory, which under planrun is the project folder); a symlink to a
            directory is followed for the root itself only.
        pattern: ``fnmatch`` glob on the file name (``*``, ``?``, ``[seq]``), e.g.
            ``"*.py"``; it cannot contain ``/``.
        exclude: paths of files to leave out even if they match (the plan passes its own
            report and summary, which may lie inside ``root``); paths that do not exist
            are ignored.

    Returns:
        ``{"root": absolute path of root with symlinks resolved, "files": [{"path":
        absolute path, "bytes": size in bytes}, ...], "count": number of files}``; files
        are sorted by their path relative to ``root`` (code point order), which is also
        the order of the absolute paths.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        NotADirectoryError: ``root`` is not a directory.
        ValueError: ``pattern`` contains ``/``, or a file name is not valid UTF-8.
        PermissionError: a directory under ``root`` cannot be read (nothing is skipped
            silently).
    """
    if "/" in pattern:
        raise ValueError(f"pattern {pattern!r} contains '/'; it is matched against file "
                         "names only (like find -name)")
    try:
        base = Path(root).resolve(strict=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"root {root!r} does not exist") from None
    if not base.is_dir():
        raise NotADirectoryError(f"root {root!r} is not a directory")
    skip = {str(Path(p).resolve()) for p in exclude}
    found: list[tuple[str, FileEntry]] = []
    for folder, _dirs, names in os.walk(base, onerror=_raise):
        for name in names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if (not stat.S_ISREG(info.st_mode) or not fnmatch.fnmatchcase(name, pattern)
                    or path in skip):
                continue
            _require_utf8(path)
            rel = Path(path).relative_to(base).as_posix()
            found.append((rel, {"path": path, "bytes": info.st_size}))
    found.sort(key=lambda pair: pair[0])
    files = [entry for _rel, entry in found]
    return {"root": str(base), "files": files, "count": len(files)}


def file_sha256(path: str) -> FileDigest:
    """Compute the SHA-256 of one regular file.

    Pure: reads the file and writes nothing, so a repeated call (e.g. after a crash) is
    harmless and gives the same answer while the file is unchanged. The file is opened
    without following a symbolic link (and without blocking on a FIFO), so a file
    replaced by a link after it was listed is refused rather than hashed through the link.

    Args:
        path: the file (absolute, as listed by :func:`list_files`).

    Returns:
        ``{"path": path exactly as given, "sha256": 64 lowercase hex digits, "bytes":
        number of bytes hashed}``.

    Raises:
        FileNotFoundError: ``path`` does not exist (e.g. deleted since it was listed).
        PermissionError: ``path`` cannot be read.
        ValueError: ``path`` is a symbolic link or not a regular file (a directory, a
            FIFO, ...).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path!r} is a symbolic link, not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        digest = hashlib.sha256()
        size = 0
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {"path": path, "sha256": digest.hexdigest(), "bytes": size}


def report_line(sha256: str, relpath: str) -> str:
    r"""One line of a ``sha256sum`` report, with its newline.

    Like GNU ``sha256sum``: a name holding a backslash, newline or carriage return is
    escaped (``\\``, ``\n``, ``\r``) and the line then starts with a backslash.

    Args:
        sha256: 64 lowercase hex digits.
        relpath: the file's path relative to the report's root, ``/``-separated.

    Returns:
        ``"<sha256>  <relpath>\n"`` (escaped as described).
    """
    if any(ch in relpath for ch in _ESCAPES):
        escaped = "".join(_ESCAPES.get(ch, ch) for ch in relpath)
        return f"\\{sha256}  {escaped}\n"
    return f"{sha256}  {relpath}\n"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in its folder and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(root: str, report: str, hashes: list[FileDigest],
                 listing: list[FileEntry]) -> Summary:
    """Write the ``sha256sum`` report of a tree and its JSON summary ``<report>.json``.

    ``hashes`` (the fan-out output, one digest per listed file, in listing order) is
    checked against ``listing``: same files in the same order and, for each, the number of
    bytes hashed equals the size listed, so a file that changed size between the two
    steps fails the report instead of being reported with a digest of other content.
    Report lines are ``<sha256>  <path relative to root>`` (see :func:`report_line`),
    sorted by relative path; an empty listing gives an empty report. Both files are
    replaced atomically and the report's folder is created if missing. Calling again
    rewrites the same report; only ``generated_at`` in the summary changes.

    Args:
        root: the listed directory (absolute, as returned by :func:`list_files`).
        report: path of the report to write (a relative path is taken from the current
            working directory, under planrun the project folder); the summary goes to
            ``<report>.json``.
        hashes: ``[{"path", "sha256", "bytes"}, ...]``, one per listed file.
        listing: ``[{"path", "bytes"}, ...]``, the files of :func:`list_files`.

    Returns:
        The summary, also written to ``<report>.json``: ``{"root": root, "report":
        absolute path of the report, "count": number of files, "total_bytes": sum of
        their sizes in bytes, "generated_at": RFC 3339 UTC time, e.g.
        "2026-11-29T12:45:00Z"}``.

    Raises:
        ValueError: ``hashes`` does not match ``listing`` (count, paths or sizes), a path
            is not under ``root``, or ``report`` is one of the listed files.
        IsADirectoryError: ``report`` is a directory.
    """
    if len(hashes) != len(listing):
        raise ValueError(f"{len(hashes)} digests for {len(listing)} listed files")
    base = Path(root)
    out = Path(report).resolve()
    if out.is_dir():
        raise IsADirectoryError(f"report {report!r} is a directory")
    lines: list[tuple[str, str]] = []
    total = 0
    for digest, entry in zip(hashes, listing, strict=True):
        path = entry["path"]
        if digest["path"] != path:
            raise ValueError(f"digest of {digest['path']!r} where {path!r} was listed")
        if digest["bytes"] != entry["bytes"]:
            raise ValueError(f"{path} had {entry['bytes']} bytes when listed and "
                             f"{digest['bytes']} when hashed: it changed during the run")
        if Path(path) in (out, out.with_name(out.name + ".json")):
            raise ValueError(f"report {report!r} would overwrite the listed file {path!r}")
        try:
            rel = Path(path).relative_to(base).as_posix()
        except ValueError:
            raise ValueError(f"{path!r} is not under root {root!r}") from None
        lines.append((rel, report_line(digest["sha256"], rel)))
        total += digest["bytes"]
    lines.sort(key=lambda pair: pair[0])
    summary: Summary = {
        "root": root,
        "report": str(out),
        "count": len(lines),
        "total_bytes": total,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(out, "".join(line for _rel, line in lines).encode("utf-8"))
    _write_atomic(out.with_name(out.name + ".json"),
                  (json.dumps(summary, indent=2) + "\n").encode("utf-8"))
    return summary
