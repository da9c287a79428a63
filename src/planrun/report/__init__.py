"""``planrun report``: a run as one self-contained HTML file (issue 18).

:func:`html_of` gathers a run from the journal (:mod:`.data`) and renders the page
(:mod:`.page`, pictures by :mod:`.svg`); :func:`save` writes it. Imported only by the
``report`` command, never at CLI start-up.
"""

from __future__ import annotations

import contextlib
import os
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

    The page goes to a temporary file beside ``path``, then replaces it; the file is
    readable by its owner only when it is new (0600 like the journal: a run's
    parameters and errors are in it), else it keeps its mode.

    Returns:
        The path written.

    Raises:
        UsageError: the folder does not exist or cannot be written, or ``path`` is a
            folder (``usage``, exit 2).
    """
    target = Path(path)
    tmp: str | None = None
    try:
        if target.is_dir():
            raise IsADirectoryError(21, "is a folder")
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o600
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
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

