"""``planrun plan``: from a goal to a plan file, through a planner (SPEC §10).

:func:`plan` resolves the planner, asks it for rounds (:func:`planrun.planners.propose`),
journals the session (one run record, status ``planning`` → ``planned`` | ``refused``)
and writes the accepted plan:

- NAME is ``--name``, else the plan's own ``name`` when it is a plain file name
  (``[A-Za-z0-9][A-Za-z0-9_.-]*``, at most 100 characters, not ending ``.yaml``,
  ``.yml`` or ``.json``), else a slug of the goal.
  The written plan's ``name`` is NAME.
- The file is ``plans/NAME.yaml``, or the existing file of plan NAME (``.yaml``, ``.yml``
  or ``.json``, looked up as ``execute NAME`` does), or ``--out FILE``. A new file gets
  ``revision: 1``; an existing one the next revision (its ``revision`` + 1), and its
  previous content is kept in the journal (the ``planned`` event's ``previous``).
- A ``.json`` file is written as JSON, anything else as YAML that reads back (YAML 1.2
  core) exactly as the plan.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from .errors import Refused, UsageError
from .issues import Issue, PlanReport

#: A NAME planrun writes a plan file under.
#: ``..`` nowhere in it: a NAME with ``..`` is refused by every command that looks a plan up
#: (SPEC §3, ``bad_name``), so ``plans/a..b.yaml`` was written and then found by none
#: (found by an attacker: a planner's ``name: a..b``).
NAME_RE = re.compile(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
#: What a plan file's name ends with (SPEC §3 "Plan lookup"): never part of a NAME.
PLAN_SUFFIXES = (".yaml", ".yml", ".json")


def plain_name(name: Any) -> TypeGuard[str]:
    """``name`` can name a plan file: :data:`NAME_RE`, and no plan file suffix of its own.

    ``x.yaml`` would be written ``plans/x.yaml.yaml``, which ``planrun execute x.yaml``
    does not find (found by an attacker).
    """
    return (isinstance(name, str) and NAME_RE.fullmatch(name) is not None
            and not name.lower().endswith(PLAN_SUFFIXES))


@dataclass
class Planned:
    """A plan a planner proposed and planrun wrote (``planrun plan``'s result).

    Attributes:
        run_id: the planning session's run id (``planrun log RUN_ID``).
        name: the plan's name (NAME).
        file: where it was written.
        revision: its revision as written.
        previous_revision: the revision it replaced, or None (a new file).
        rounds: how many rounds it took.
        digest: SHA-256 of the canonical JSON of the plan as journaled.
        data: the plan as written.
        text: the file's text.
        warnings: validation warnings of the accepted plan.
    """

    run_id: str | None
    name: str
    file: Path
    revision: int
    previous_revision: int | None
    rounds: int
    digest: str
    data: dict[str, Any]
    text: str
    warnings: list[Issue] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """What ``plan --json`` prints.

        ``{"ok", "run_id", "name", "file", "revision", "previous_revision", "rounds",
        "digest", "plan", "warnings"}``.
        """
        from .paths import shown_path

        return {"ok": True, "run_id": self.run_id, "name": self.name,
                "file": shown_path(self.file), "revision": self.revision,
                "previous_revision": self.previous_revision, "rounds": self.rounds,
                "digest": self.digest, "plan": self.data,
                "warnings": [w.to_json() for w in self.warnings]}


def slug(goal: str) -> str:
    """A plan name from a goal: lower-case words joined by ``-`` (at most 60 characters)."""
    words = re.findall(r"[a-z0-9]+", goal.lower())
    text = "-".join(words)[:60].strip("-")
    return text or "plan"


def _dumper() -> Any:
    import yaml

    from .yamltext import CoreResolver

    core = CoreResolver()

    class Dumper(yaml.SafeDumper):
        """SafeDumper that quotes every string YAML 1.2 core would read as another type."""

    def represent_str(dumper: Any, value: str) -> Any:
        tag = core.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
        quoted = tag != "tag:yaml.org,2002:str"
        return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                       style='"' if quoted else None)

    Dumper.add_representer(str, represent_str)
    return Dumper


def render(data: dict[str, Any], suffix: str) -> str:
    """The plan as file text: JSON for ``.json``, else YAML that reads back as ``data``."""
    if suffix == ".json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    import yaml

    from .loading import DocumentError, parse_text

    text: str = yaml.dump(data, Dumper=_dumper(), sort_keys=False, allow_unicode=True,
                          width=100, default_flow_style=False)
    try:
        same = parse_text(text, kind="yaml").data == data
    except DocumentError:
        same = False
    # JSON is YAML too: the fallback for anything the YAML emitter would not round-trip.
    return text if same else json.dumps(data, indent=2, ensure_ascii=False) + "\n"


#: Why a plan file is not written (:func:`_write`): what is there is no regular file.
NOT_REGULAR = ("it is not a regular file (a FIFO, a device, a socket or a folder); planrun "
               "never writes a plan over one")


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in its folder, renamed).

    Only a regular file (or a new one) is replaced. A symlink to a regular file stays a
    symlink: the file it names is replaced (as ``planrun report --out`` does). Anything
    else where the plan file would be — a FIFO, a device, a socket, a folder, a symlink to
    one of them or to nothing — is never replaced nor opened (a FIFO would be waited on).
    Never over a journal (:func:`planrun.paths.refuse_database`).

    Raises:
        OSError: not written (:data:`NOT_REGULAR` as ``strerror`` for what is no regular
            file); callers make it ``usage`` (exit 2).
    """
    from .paths import refuse_database

    if os.path.lexists(path):
        try:
            found = os.stat(path)  # through a symlink
        except FileNotFoundError:
            raise OSError(0, "it is a symlink to nothing; planrun never writes a plan "
                          "through one") from None
        if not stat.S_ISREG(found.st_mode):
            raise OSError(0, NOT_REGULAR)
        if os.path.islink(path):
            path = Path(os.path.realpath(path))
    refuse_database(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock (POSIX ``flock``) on ``folder`` for the block.

    Taken by whatever reads a plan file's revision and writes the next one (``plan``,
    ``repair``), so that two of them at once write one revision after the other. The
    folder is created when missing (as :func:`_write` would); where it cannot be opened
    or locked, the block runs unlocked (the write then says what is wrong).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _suppress() -> Any:
    import contextlib

    return contextlib.suppress(OSError)


def _existing(settings: Any, name: str | None, out: str | None) -> Path | None:
    """The file the plan will replace, if there is one."""
    from .paths import PlanLookupError, find_plan, probe

    if out is not None:
        p = Path(out)
        return p if probe(p, "is_file") else None
    if name is None:
        return None
    try:
        return find_plan(name, settings.plans_dir)
    except PlanLookupError:
        return None


def _checked_out(settings: Any, out: str | None) -> str | None:
    """``--out`` as an absolute path, checked before the planner is asked.

    Raises:
        UsageError: it is empty, or its folder does not exist (only the project's plans
            folder is created when missing), exit 2.
    """
    if out is None:
        return None
    if not out.strip():
        raise UsageError("--out is empty: give the file to write the plan to",
                         hint="e.g. --out plans/backup.yaml")
    target = Path(out).absolute()
    folder = target.parent
    plans = Path(settings.plans_dir).absolute()
    if not folder.is_dir() and folder != plans:
        raise UsageError(f"--out {out}: the folder {folder} does not exist",
                         hint=f"Create it first (mkdir -p {folder}), or give another path.")
    return str(target)


def _previous(path: Path | None) -> tuple[Any, str | None, int | None]:
    """(document or None, text or None, revision or None) of the file being replaced."""
    if path is None:
        return None, None, None
    from .loading import DocumentError, load_file

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, None, 0
    try:
        data = load_file(path).data
    except DocumentError:
        return None, text, 0
    rev = data.get("revision", 1) if isinstance(data, dict) else 0
    if isinstance(rev, bool) or not isinstance(rev, int) or rev < 0:
        rev = 0
    return data, text, rev


def _secret_names(data: Any) -> set[str]:
    params = data.get("params") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        return set()
    return {n for n, s in params.items() if isinstance(s, dict) and s.get("secret") is True}


def plan(settings: Any, goal: str, planner: str, *, name: str | None = None,
         max_rounds: int | None = None, given: Any = None, out: str | None = None,
         concrete: bool | None = None,
         on_round: Callable[[int, PlanReport | None], None] | None = None) -> Planned:
    """Ask a planner for a plan for ``goal``; write and journal the accepted one.

    Args:
        settings: the invocation's settings.
        goal: what the plan is for (free text, given to the planner).
        planner: ``cmd:ARGV``, ``python:module:callable`` or a ``[planners]`` name.
        name: NAME (default: see the module docstring).
        max_rounds: the bound (default: the planner table's ``max_rounds``, else 3).
        given: parameter values (``ParamInput``): sent to the planner (secrets as
            references) and used to validate.
        out: write here instead of the plans folder (its folder must exist, unless it is
            the project's plans folder).
        concrete: validate with concrete values (``execute --planner``); default: when
            values were given.
        on_round: called after each round with its report (None: accepted).

    Returns:
        What was written (:class:`Planned`).

    Raises:
        UsageError: an empty goal, a bad ``--name``, a malformed ``--planner``, an empty
            ``out`` or one in a missing folder, a file that cannot be written (exit 2).
        Refused: the registry or configuration is invalid (``registry``/``config``), or no
            plan within the bound (``replan_exhausted``, with the last report), exit 3.
        JournalError: the journal is unusable (exit 6).
    """
    from . import redact
    from .canonical import digest
    from .checking import journaled_path, load_registry
    from .planners import (
        DEFAULT_MAX_ROUNDS,
        JournalSession,
        PlannerParams,
        propose,
        request_base,
        resolve_planner,
    )

    if not goal.strip():
        raise UsageError("the goal is empty: say what the plan is for",
                         hint="e.g. planrun plan 'back up data to /backups keeping 7' "
                         "--planner P")
    if name is not None and not NAME_RE.fullmatch(name):
        raise UsageError(f"--name {name!r}: a plan name is letters, digits, '.', '_' and "
                         "'-' (starting with a letter or digit, no '..', at most 100 "
                         "characters)")
    if name is not None and name.lower().endswith(PLAN_SUFFIXES):
        # it wrote plans/x.yaml.yaml, which `planrun execute x.yaml` does not find as a
        # name (found by an attacker): the name is the file's stem
        stem = name.rsplit(".", 1)[0]
        raise UsageError(f"--name {name!r}: give the plan's name without a file suffix",
                         hint=f"--name {stem} writes plans/{stem}.yaml; --out FILE writes "
                         "another file")
    out = _checked_out(settings, out)
    who = resolve_planner(settings, planner)
    rounds = max_rounds or who.max_rounds or DEFAULT_MAX_ROUNDS
    registry = load_registry(settings)
    before = _existing(settings, name, out)
    prev_data, prev_text, prev_rev = _previous(before)
    params = PlannerParams(given, _secret_names(prev_data))
    # Only names until the session ends: whether a value is secret may be learned from a
    # proposal (a secret's value never lands in the journal, not even before it is known).
    session = JournalSession(settings, goal=goal, name=name or slug(goal), planner=who.label,
                             mode="plan", params={n: redact.reference(n)
                                                  for n in params.request()},
                             max_rounds=rounds)
    base = request_base(registry, goal=goal, mode="plan")
    try:
        session.start()
        accepted = propose(settings, who, base, max_rounds=rounds, registry=registry,
                           given=given, concrete=concrete, name_hint=name or slug(goal),
                           session=session, params=params, on_round=on_round)
    except Refused as exc:
        session.params = params.request()  # secrets a proposal declared are references now
        report = exc.report.to_json() if exc.report is not None else {}
        session.fail({"code": exc.code, "rounds": rounds, **report})
        exc.message = (f"no valid plan in {rounds} round(s); the last report is above. "
                       f"planrun log {session.run_id} shows every round")
        # --json, MCP: the report is the error's "plans", or follows it
        exc.placed_message = (f"no valid plan in {rounds} round(s) (planrun log "
                              f"{session.run_id} shows every round)")
        raise
    except BaseException as exc:  # Ctrl-C, a journal error: the session does not stay open
        if session.run_id is not None:
            with _suppress_all():
                code = ("interrupted" if isinstance(exc, KeyboardInterrupt | SystemExit)
                        else getattr(exc, "code", "internal"))
                session.fail({"code": code, "message": interrupted_text(exc)})
        raise
    session.params = params.request()
    data = accepted.data
    own = data.get("name")
    final_name = name or (own if plain_name(own) else slug(goal))
    target = Path(out) if out is not None else settings.plans_dir / f"{final_name}.yaml"
    try:
        # The file being replaced is read again now, and written under the folder's lock:
        # a planner's rounds can take minutes, and a revision saved meanwhile (by a person)
        # was overwritten by a lower revision and lost from the journal too (found by a
        # fresh operator); two `planrun plan` of one name at once both wrote "revision 1
        # (new)", the second over the first (found by an attacker): now the second is the
        # next revision of the first.
        with folder_lock(Path(out).parent if out is not None else Path(settings.plans_dir)):
            before = _existing(settings, final_name, out)
            prev_data, prev_text, prev_rev = _previous(before)
            target = Path(out) if out is not None else (
                before or settings.plans_dir / f"{final_name}.yaml")
            revision = 1 if before is None else (prev_rev or 0) + 1
            final: dict[str, Any] = {"planrun": data.get("planrun", 1), "name": final_name,
                                     "revision": revision}
            final.update({k: v for k, v in data.items()
                          if k not in ("planrun", "name", "revision")})
            text = render(final, target.suffix)
            _write(target, text)  # a device, a FIFO: never replaced
    except OSError as exc:
        session.fail({"code": "usage", "message": f"cannot write {target}: "
                      f"{exc.strerror or exc}"})
        raise UsageError(f"cannot write the plan to {target}: {exc.strerror or exc}",
                         hint="Give --out a writable path.") from None
    secrets = params.secrets()
    stored = secrets.conceal(redact.stored_plan(final))
    dig = digest(stored)
    previous: dict[str, Any] | None = None
    if before is not None:
        previous = {"file": journaled_path(before, settings), "revision": prev_rev}
        if prev_data is not None and redact.stored_plan(prev_data) is not prev_data:
            # A secret default in the old file: keep the document with it as a reference.
            previous["document"] = secrets.conceal(redact.stored_plan(prev_data))
        else:
            previous["content"] = secrets.conceal_text(prev_text or "")
    session.accepted(plan=stored, digest=dig, name=final_name, revision=revision,
                     plan_file=journaled_path(target, settings),
                     data={"round": accepted.round, "digest": dig, "name": final_name,
                           "revision": revision, "file": journaled_path(target, settings),
                           "planner": who.label, "previous": previous})
    return Planned(run_id=session.run_id, name=final_name, file=target, revision=revision,
                   previous_revision=prev_rev if before is not None else None,
                   rounds=accepted.round, digest=dig, data=final, text=text,
                   warnings=[i for i in accepted.report.issues if i.severity == "warning"])


def interrupted_text(exc: BaseException) -> str:
    """What stopped a planning session, in words (it was journaled as ``KeyboardInterrupt``)."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by SIGINT (Ctrl-C) before a plan was accepted"
    if isinstance(exc, SystemExit):
        signal = "SIGTERM" if exc.code == 143 else "a signal"
        return f"stopped by {signal} before a plan was accepted"
    return type(exc).__name__


def _suppress_all() -> Any:
    import contextlib

    return contextlib.suppress(Exception)
