"""``planrun report``: a run as one self-contained HTML file (issue 18).

:func:`html_of` gathers a run from the journal (:mod:`.data`) and renders the page
(:mod:`.page`, pictures by :mod:`.svg`); :func:`save` writes it. Imported only by the
``report`` command, never at CLI start-up.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from ..errors import UsageError
from ..journal import Journal
from .data import RunReport, gather
from .page import render, report_file

__all__ = ["RunReport", "gather", "html_of", "render", "report_file", "save"]


def html_of(journal: Journal, run_id: str) -> str:
    """The report page of run ``run_id`` (HTML text; secrets shown as ``***``).

    Raises:
        RunError: ``unknown_run`` (exit 5).
        JournalError: the journal cannot be read (exit 6).
    """
    from .. import __version__

    return render(gather(journal, run_id), version=__version__)


def save(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` whole: a reader never sees half a report.

    A regular file (or a new one) is replaced: the page goes to a temporary file beside
    it, then is renamed over it; a symlink stays a symlink (the file it names is
    replaced). A new file is readable by its owner only (0600 like the journal: a run's
    parameters and errors are in it); an existing one keeps its mode. Anything else
    that exists (a device such as ``/dev/stdout``, a FIFO) is written to as it is, never
    replaced. An SQLite database (a journal) or a file SQLite keeps beside one is never
    written over (:func:`planrun.paths.refuse_database`).

    Returns:
        The path written (as given).

    Raises:
        UsageError: the folder does not exist or cannot be written, ``path`` is a
            folder or a journal, or writing fails (a full disk) (``usage``, exit 2).
    """
    from ..loading import utf8_text
    from ..paths import refuse_database

    text = utf8_text(text)  # a tool's message may hold a lone surrogate (a file name)
    target = Path(path)
    tmp: str | None = None
    try:
        real = target.resolve() if target.is_symlink() else target
        refuse_database(real)
        if real.is_dir():
            raise IsADirectoryError(21, "is a folder")
        found = real.stat() if real.exists() else None
        if found is not None and not stat.S_ISREG(found.st_mode):
            with open(real, "w", encoding="utf-8") as f:  # a device or a FIFO
                f.write(text)
            return target
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", dir=real.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600 if found is None else found.st_mode & 0o777)
        os.replace(tmp, real)
        tmp = None
    except OSError as exc:
        raise UsageError(f"cannot write the report to {target}: "
                         f"{exc.strerror or exc}",
                         hint="Give --out a file in a folder you can write, or - for "
                         "stdout.") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target
