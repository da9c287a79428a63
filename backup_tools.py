"""Python tools of the ``nightly-backup`` plan (``plans/nightly-backup.yaml``).

Registered in ``tools.yaml`` as ``backup_tools:FUNC``; planrun imports this module with
the registry's folder (the repository root) on ``sys.path`` and calls each function with
its validated arguments as keyword arguments.

Naming: an archive is ``backup-<STAMP>.tar.gz`` where ``<STAMP>`` is the UTC date and
time of the run with 1-second resolution, ``YYYYMMDDTHHMMSSZ`` (e.g.
``backup-20261129T124500Z.tar.gz``). Its sidecar files are ``<archive>.sha256``
(``sha256sum`` format) and ``<archive>.manifest.json``. :func:`prune` only ever touches
files with exactly these names.

Two runs in the same second would pick the same name. :func:`check_dirs` therefore
*reserves* the archive name with an exclusive create (``O_CREAT | O_EXCL``) before
``tar`` writes it; a name already taken is never overwritten: the second run takes the
name of the next free second instead (so neither it nor a retry of it is a dead end).

Paths: python tools and command tools both run in the project folder (README "Tools"),
whatever folder ``planrun`` was started in; :func:`check_dirs` still returns absolute
paths and every later step uses those, so that a step's output (in the journal, in a
report) names the same place wherever it is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypedDict

#: ``strftime`` format of the stamp in archive names (UTC, 1-second resolution).
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"
#: The exact archive name; group 1 is the stamp. Nothing else is ever pruned.
ARCHIVE_NAME = re.compile(r"^backup-([0-9]{8}T[0-9]{6}Z)\.tar\.gz$")
#: How many seconds past its stamp an archive name may move when names are taken.
MAX_STAMP_SHIFT_S = 3600
#: Suffixes of the sidecar files written next to an archive.
SIDECAR_SUFFIXES = (".sha256", ".manifest.json")
_CHUNK = 1 << 20


class Prepared(TypedDict):
    """Output of :func:`check_dirs`: absolute, symlink-free paths."""

    source: str
    dest: str
    archive: str


class Checksum(TypedDict):
    """Output of :func:`checksum`."""

    path: str
    sha256: str
    bytes: int


class Manifest(TypedDict):
    """Content of ``<archive>.manifest.json`` and output of :func:`manifest`."""

    source: str
    archive: str
    bytes: int
    sha256: str
    created_at: str
    source_files: int
    source_bytes: int


class PruneResult(TypedDict):
    """Output of :func:`prune`."""

    kept: list[str]
    deleted: list[str]


def utc_stamp() -> str:
    """The current UTC date and time as used in archive names.

    Returns:
        Text ``YYYYMMDDTHHMMSSZ``, e.g. ``"20261129T124500Z"`` (UTC, whole seconds).
        Two calls in the same second return the same text; :func:`check_dirs` is what
        stops two runs from sharing an archive name.
    """
    return datetime.now(UTC).strftime(STAMP_FORMAT)


def _stamp_time(stamp: str) -> datetime | None:
    """The UTC time of a stamp, or None when it is not a real date and time."""
    try:
        return datetime.strptime(stamp, STAMP_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _reservation_marker() -> str:
    """Text written into a reserved archive name: identifies this tool call.

    Inside planrun it holds the call's idempotency key, so a repeated call of the same
    step (same key, e.g. after a crash) recognises its own reservation. Outside planrun
    no call can recognise another's reservation.
    """
    try:
        # ``planrun.context()`` is documented but not exported by the package (yet);
        # the function lives in ``planrun.tools``.
        from planrun.tools import context

        key = context().idempotency_key
    except (ImportError, LookupError):
        key = os.urandom(16).hex()
    return f"planrun nightly-backup reservation {key}\n"


def check_dirs(source: str, dest: str, name: str) -> Prepared:
    """Check the source, create the destination and reserve the archive name.

    ``source`` must be an existing directory. ``dest`` is created if missing, but not
    its missing parents (a backup disk not mounted: FileNotFoundError). ``dest`` may be
    neither ``source`` itself nor inside it, or ``tar`` would
    archive its own output. The archive file ``dest/name`` is then created exclusively as
    a small placeholder that ``tar`` overwrites. If that name is taken (a backup started
    in the same second, or any other file of that name) nothing is overwritten: the name
    of the next second is tried, up to :data:`MAX_STAMP_SHIFT_S` seconds later, so that
    neither this run nor a retry of it fails on a taken stamp (issue 10, bug 5). Calling
    again with the same planrun idempotency key accepts the placeholder it wrote itself
    (at whichever second), so the call is safe to repeat after an unknown outcome.

    Args:
        source: directory to back up (relative paths are taken from the current working
            directory).
        dest: directory receiving the archives.
        name: archive file name, ``backup-YYYYMMDDTHHMMSSZ.tar.gz``.

    Returns:
        ``{"source", "dest", "archive"}``: absolute paths with symlinks resolved;
        ``archive`` is ``dest/name`` (or the name of a later second when it was taken).

    Raises:
        FileNotFoundError: ``source`` does not exist.
        NotADirectoryError: ``source`` or ``dest`` exists but is not a directory.
        ValueError: ``name`` is not an archive name, or ``dest`` is ``source`` or lies
            inside it.
        FileExistsError: ``dest/name`` and the names of the next
            :data:`MAX_STAMP_SHIFT_S` seconds all exist (none this call's reservation).
    """
    match = ARCHIVE_NAME.fullmatch(name)
    if match is None or _stamp_time(match.group(1)) is None:
        raise ValueError(f"archive name {name!r} is not backup-YYYYMMDDTHHMMSSZ.tar.gz")
    try:
        src = Path(source).resolve(strict=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"source {source!r} does not exist") from None
    if not src.is_dir():
        raise NotADirectoryError(f"source {source!r} is not a directory")
    dst_given = Path(dest)
    if dst_given.exists() and not dst_given.is_dir():
        raise NotADirectoryError(f"dest {dest!r} exists and is not a directory")
    dst = dst_given.resolve()
    if dst == src or dst.is_relative_to(src):
        raise ValueError(f"dest {str(dst)!r} is inside source {str(src)!r}: the archive "
                         "would contain itself; choose a dest outside the source directory")
    _make_folder(dst, "dest")
    dst = dst.resolve(strict=True)
    if dst == src or dst.is_relative_to(src):  # a symlink created meanwhile
        raise ValueError(f"dest {str(dst)!r} is inside source {str(src)!r}")
    marker = _reservation_marker()
    base = _stamp_time(match.group(1))
    assert base is not None
    for later in range(MAX_STAMP_SHIFT_S + 1):
        stamp = (base + timedelta(seconds=later)).strftime(STAMP_FORMAT)
        archive = dst / f"backup-{stamp}.tar.gz"
        try:
            fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                ours = archive.is_file() and archive.read_text(errors="replace") == marker
            except OSError:
                ours = False
            if ours:
                break
            continue  # taken (another backup in that second): try the next second
        with os.fdopen(fd, "w") as f:
            f.write(marker)
        break
    else:
        raise FileExistsError(
            f"{dst / name} and the archive names of the next {MAX_STAMP_SHIFT_S} seconds "
            "all exist; refusing to overwrite any: remove stray backup-*.tar.gz files "
            "from dest, then retry")
    return {"source": str(src), "dest": str(dst), "archive": str(archive)}


def _make_folder(folder: Path, what: str) -> None:
    """Create ``folder`` if missing, but never its missing parents.

    A backup disk that is not mounted leaves its mount point's folder missing (or empty):
    creating the whole path would write the backup onto the disk under it and report it
    done (found by a fresh operator whose disk vanished mid-run).

    Raises:
        FileNotFoundError: the parent of ``folder`` does not exist.
    """
    try:
        folder.mkdir(exist_ok=True)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{what} {str(folder)!r} cannot be created: its parent {str(folder.parent)!r} "
            "does not exist (a backup disk that is not mounted?); create it, or mount the "
            "disk, then retry") from None


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def checksum(path: str) -> Checksum:
    """Compute the SHA-256 of a file and write ``<path>.sha256`` next to it.

    The sidecar is in ``sha256sum`` format: one line, the hex digest, two spaces, the
    file's name (relative to its folder), so ``sha256sum -c <path>.sha256`` run in that
    folder checks it. It is replaced atomically; calling again rewrites the same content.

    Args:
        path: the file (the archive).

    Returns:
        ``{"path": absolute path, "sha256": 64 lowercase hex digits, "bytes": size in
        bytes}``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        IsADirectoryError: ``path`` is a directory.
    """
    file = Path(path).resolve(strict=True)
    digest = hashlib.sha256()
    size = 0
    with file.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    hexdigest = digest.hexdigest()
    _write_atomic(file.with_name(file.name + ".sha256"), f"{hexdigest}  {file.name}\n")
    return {"path": str(file), "sha256": hexdigest, "bytes": size}


def manifest(source: str, archive: str, sha256: str, archive_bytes: int) -> Manifest:
    """Describe a backup in ``<archive>.manifest.json`` and return the same object.

    The file and source counts are read from the archive itself (its regular-file
    members), so they describe exactly what was captured even if the source directory
    changed after ``tar`` ran; reading the whole archive also proves it decompresses.
    ``created_at`` is the time in the archive's name. The file is replaced atomically;
    calling again writes the same content.

    Args:
        source: the directory that was archived (absolute path).
        archive: the archive, ``.../backup-YYYYMMDDTHHMMSSZ.tar.gz``.
        sha256: its SHA-256 (64 lowercase hex digits), from the checksum step.
        archive_bytes: its size in bytes, from the checksum step.

    Returns:
        ``{"source", "archive", "bytes", "sha256", "created_at", "source_files",
        "source_bytes"}``: ``created_at`` is RFC 3339 UTC (``2026-11-29T12:45:00Z``),
        ``source_files`` the number of regular files archived and ``source_bytes`` the
        sum of their sizes in bytes.

    Raises:
        ValueError: the archive's name has no valid stamp, or its size is not
            ``archive_bytes``.
        FileNotFoundError: the archive does not exist.
        tarfile.TarError: the archive cannot be read as a gzip tar file.
    """
    file = Path(archive).resolve(strict=True)
    match = ARCHIVE_NAME.fullmatch(file.name)
    created = _stamp_time(match.group(1)) if match else None
    if created is None:
        raise ValueError(f"{file.name!r} is not backup-YYYYMMDDTHHMMSSZ.tar.gz")
    size = file.stat().st_size
    if size != archive_bytes:
        raise ValueError(f"{file} has {size} bytes, the checksum step saw {archive_bytes}: "
                         "it changed after it was checksummed")
    files = total = 0
    with tarfile.open(file, "r:gz") as tar:
        for member in tar:
            if member.isreg():
                files += 1
                total += member.size
    result: Manifest = {
        "source": source,
        "archive": str(file),
        "bytes": archive_bytes,
        "sha256": sha256,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source_files": files,
        "source_bytes": total,
    }
    _write_atomic(file.with_name(file.name + ".manifest.json"),
                  json.dumps(result, indent=2) + "\n")
    return result


def prune(dest: str, keep: int) -> PruneResult:
    """Keep the newest ``keep`` archives in ``dest`` and delete the older ones.

    Only regular files named exactly ``backup-YYYYMMDDTHHMMSSZ.tar.gz`` (with a real
    date and time) whose ``.sha256`` and ``.manifest.json`` sidecars both exist count as
    archives; they are ordered by the stamp in their name, newest first. An archive
    without them (cut short: a full disk, a crash inside ``tar``) is not counted, so it
    never makes a good backup go: it is deleted when older than every archive kept, else
    left and listed (``incomplete``). For each archive that goes, its sidecars
    ``<archive>.sha256`` and ``<archive>.manifest.json`` are deleted first, then the
    archive itself, so an interrupted prune leaves the archive to be pruned next time.
    Every other file (other names, directories, symlinks, orphan sidecars) is left
    alone. Calling again with the same arguments deletes nothing more.

    Args:
        dest: the folder holding the archives.
        keep: how many archives to keep (at least 1).

    Returns:
        ``{"kept": [...], "deleted": [...], "incomplete": [...]}``: file names (not
        paths) inside ``dest``; ``kept`` lists the archives kept, newest first;
        ``deleted`` every file deleted (archives and their sidecars), oldest archive
        first; ``incomplete`` the archives without both sidecars, newest first.

    Raises:
        ValueError: ``keep`` is less than 1.
        NotADirectoryError: ``dest`` is not a directory.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    folder = Path(dest)
    if not folder.is_dir():
        raise NotADirectoryError(f"{dest!r} is not a directory")
    archives: list[tuple[str, str]] = []
    incomplete: list[tuple[str, str]] = []
    with os.scandir(folder) as entries:
        names = set()
        found = []
        for entry in entries:
            names.add(entry.name)
            match = ARCHIVE_NAME.fullmatch(entry.name)
            if (match and _stamp_time(match.group(1)) is not None
                    and entry.is_file(follow_symlinks=False)):
                found.append((match.group(1), entry.name))
    for stamp, name in found:
        # a backup counts once its checksum and manifest were written: an archive cut
        # short (a full disk, a crash inside tar) must not push a good one out
        whole = all(name + suffix in names for suffix in SIDECAR_SUFFIXES)
        (archives if whole else incomplete).append((stamp, name))
    archives.sort(reverse=True)
    kept = [name for _stamp, name in archives[:keep]]
    going = archives[keep:]
    if len(archives) >= keep:  # an incomplete one older than every kept backup goes too
        oldest = archives[keep - 1][0]
        going += [a for a in incomplete if a[0] < oldest]
        incomplete = [a for a in incomplete if a[0] >= oldest]
    going.sort(reverse=True)
    deleted: list[str] = []
    for _stamp, name in reversed(going):
        for suffix in SIDECAR_SUFFIXES:
            sidecar = folder / (name + suffix)
            if sidecar.is_file() and not sidecar.is_symlink():
                sidecar.unlink()
                deleted.append(sidecar.name)
        (folder / name).unlink()
        deleted.append(name)
    return {"kept": kept, "deleted": deleted,
            "incomplete": [name for _stamp, name in sorted(incomplete, reverse=True)]}


#: The file :func:`mark_failed` writes in ``dest`` when a nightly run fails.
FAILURE_MARKER = "BACKUP-FAILED.json"


class FailureMark(TypedDict):
    """Output of :func:`mark_failed` and content of :data:`FAILURE_MARKER`."""

    marker: str
    run_id: str | None
    failed_at: str


def mark_failed(source: str, dest: str) -> FailureMark:
    """Write ``dest/BACKUP-FAILED.json``: the plan's notify step (``run_if: failure``).

    ``dest`` is created if missing (not its missing parents), but never inside ``source`` (the
    mistake :func:`check_dirs` refuses: nothing is written into the data being backed up).
    The marker names the run (its run id inside planrun; null outside) and the UTC time;
    an existing marker is replaced. :func:`prune` never touches it (not an archive name).

    Args:
        source: the directory the run backs up (it may not exist).
        dest: the backup folder.

    Returns:
        ``{"marker": absolute path, "run_id": str | None, "failed_at": RFC 3339 UTC}``.

    Raises:
        ValueError: ``dest`` is ``source`` or lies inside it.
        OSError: ``dest`` cannot be created or written.
    """
    try:
        from planrun.tools import context

        run_id: str | None = context().run_id
    except (ImportError, LookupError):
        run_id = None
    folder, src = Path(dest).resolve(), Path(source).resolve()
    if folder == src or folder.is_relative_to(src):
        raise ValueError(f"dest {str(folder)!r} is inside source {str(src)!r}; no failure "
                         "marker is written into the data being backed up")
    _make_folder(folder, "dest")
    path = folder / FAILURE_MARKER
    mark: FailureMark = {"marker": str(path), "run_id": run_id,
                         "failed_at": datetime.now(UTC).isoformat(timespec="seconds")}
    _write_atomic(path, json.dumps(mark, indent=2) + "\n")
    return mark
