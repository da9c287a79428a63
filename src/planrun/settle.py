"""What a person settles that planrun cannot prove: ``resolve`` and ``unlock`` (SPEC §7).

``resolve`` records the effect of a step left indeterminate by a crash (succeeded, with
its output, or failed); ``unlock`` releases a lease whose holder cannot be proven dead
from this host.
"""

from __future__ import annotations

from typing import Any

from . import redact
from .approval import user_name
from .checking import load_registry
from .errors import UsageError
from .journal import Journal, RunRecord
from .journal.store import lease_owner
from .paths import Settings


def resolve(settings: Settings, run_ref: str, step: str, *, succeeded: bool,
            output: str | None, reason: str | None, item: int | None = None
            ) -> dict[str, Any]:
    """Settle an indeterminate step by a person's word (``indeterminate_resolved``).

    Raises:
        UsageError: ``--output`` is not JSON (exit 2).
        RunError: ``unknown_run``, ``run_busy``, or the step is not indeterminate (exit 5).
    """
    value = None
    if output is not None:
        if not succeeded:
            raise UsageError("--output goes with --succeeded")
        from .loading import DocumentError, parse_text

        try:  # the rules of a JSON file: finite numbers, bounded depth, text, no dup keys
            value = redact.escape_value(parse_text(output, kind="json").data)
        except DocumentError as exc:
            raise UsageError(f"--output is not valid JSON: {exc.issues[0].message}") from None
    owner = lease_owner()
    with Journal(settings.journal, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        journal.take_lease(run_id, owner)
        try:
            if item is None and journal.items(run_id, step):
                raise UsageError(f"step {step!r} fans out: resolve its indeterminate items "
                                 "one by one with --item N")
            if succeeded:
                _check_resolved_output(settings, journal.run(run_id), step, item,
                                       value, output is not None)
            facets = _facets_of(journal.run(run_id), step, value) \
                if succeeded and item is None else None
            journal.resolve_step(run_id, step, succeeded=succeeded, output=value,
                                 reason=reason, decided_by=user_name(), item=item,
                                 facets=facets,
                                 skips=_stale_skips(journal, run_id, step, succeeded)
                                 if item is None else None)
        finally:
            journal.release_lease(run_id, owner)
        from . import manifest

        return manifest.build(journal, run_id)


def _stale_skips(journal: Journal, run_id: str, step: str, succeeded: bool
                 ) -> dict[str, str]:
    """Skipped steps whose reason says ``step`` is indeterminate → their reason once resolved.

    Their skip was decided while ``step`` was indeterminate; the journal keeps that they
    were skipped (a failed run is not run further: ``planrun retry`` runs them), but their
    reason is current text in ``status`` and the report, and "dependency 'x' indeterminate"
    is no longer true once ``x`` is resolved. Steps skipped because *they* depend on a
    skipped step keep their reason ("dependency 'y' skipped" stays true).
    """
    from .execution.common import dependency_message

    was = dependency_message(step, "indeterminate")
    now = (f"{was} when the run stopped; resolved as succeeded since" if succeeded
           else dependency_message(step, "failed") + " (resolved as failed)")
    return {r.step_id: now for r in journal.steps(run_id)
            if r.status == "skipped" and r.skip_reason == "dependency"
            and isinstance(r.error, dict) and r.error.get("message") == was}


def _facets_of(row: RunRecord, step: str, output: Any) -> dict[str, Any] | None:
    """The facets the journaled plan declares for ``step``, computed from ``output``."""
    from .facets import of_output

    for s in (row.plan.get("steps") or []) if isinstance(row.plan, dict) else []:
        if isinstance(s, dict) and s.get("id") == step:
            return of_output(s.get("facets"), output)
    return None


def _readers(document: Any, step: str) -> list[str]:
    """Ids of the plan's steps that read ``step``'s output.

    In their arguments, ``for_each`` or ``when``.
    """
    import re

    from .params import StepRef, references

    out = []
    for s in (document.get("steps") or []) if isinstance(document, dict) else []:
        if not isinstance(s, dict):
            continue
        used = {"arguments": s.get("arguments"), "for_each": s.get("for_each")}
        reads = any(isinstance(ref, StepRef) and ref.step == step
                    for _ptr, ref in references(used))
        when = s.get("when")
        if not reads and isinstance(when, str):
            reads = re.search(rf"\bsteps\.{re.escape(step)}\b", when) is not None
        if reads:
            out.append(str(s.get("id")))
    return out


def _check_resolved_output(settings: Settings, row: RunRecord, step: str,
                           item: int | None, value: Any, given: bool) -> None:
    """Refuse a ``resolve --succeeded`` whose output later steps could not use.

    Without ``--output`` the output is null: refused when a later step reads it (it would
    fail on the null, and a succeeded step cannot be resolved again). A given output must
    fit the tool's ``output_schema`` (per item for a fan-out) in the current registry.

    Raises:
        UsageError: ``usage`` (exit 2), naming the readers or the schema problem.
    """
    what = f"step {step!r}" + (f" item {item}" if item is not None else "")
    readers = _readers(row.plan, step)
    if not given and readers:
        raise UsageError(f"{what}: later steps read its output ({', '.join(readers)}), so "
                         "resolving it as succeeded needs the output it produced",
                         hint="Give it with --output JSON (as `planrun output` would print "
                         "it), or resolve it --failed.")
    if not given:
        return
    try:
        registry = load_registry(settings)
    except Exception:  # no registry to check against: the journal keeps what was given
        return
    tool = None
    for s in row.plan.get("steps") or []:
        if isinstance(s, dict) and s.get("id") == step:
            tool = s.get("tool")
    spec = registry.tools.get(tool) if isinstance(tool, str) else None
    schema = getattr(getattr(spec, "entry", None), "output_schema", None)
    if not schema:
        return
    from .registry import strict_validator

    errors = [e.message for e in strict_validator(schema).iter_errors(value)]
    if errors:
        raise UsageError(f"--output does not fit the output_schema of tool {tool!r} "
                         f"({what}): {errors[0]}",
                         hint="Give the output the tool would have returned.")


def unlock(settings: Settings, run_ref: str) -> dict[str, Any]:
    """Release a run's lease whose holder cannot be proven dead automatically.

    Returns ``{"run_id", "released", "owner"}``.

    Raises:
        RunError: ``run_busy`` when the holder is a live process on this host (exit 5).
    """
    with Journal(settings.journal, write=True) as journal:
        run_id = journal.resolve_run_id(run_ref)
        holder = journal.unlock(run_id)
        return {"run_id": run_id, "released": holder is not None, "owner": holder}
