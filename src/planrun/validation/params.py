"""Parameters: the declarations under ``params:`` and the values given for them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import redact
from ..issues import listed
from ..loading import has_surrogate
from ..params import UNKNOWN, parse_cli_value
from ..pointers import pointer
from ..registry import schema_problems, strict_validator
from .plan import ParamInput
from .report import Collector, secret_rule


@dataclass(eq=False)
class ParamValues:
    """The parameters of one plan after checking.

    Attributes:
        declared: ``params:`` as written (name → schema; {} when absent or not a mapping).
        values: name → value (defaults applied; :data:`~planrun.params.UNKNOWN` when it has
            none or it is wrong), secret values included.
        secrets: names marked ``secret: true``.
        stored: the values in reference form (what is stored, keyed and shown): a secret's
            value is a reference, the others have the reference markers escaped.
        plain: no secret and no value holding a marker (``stored`` equals ``values``).
    """

    declared: dict[str, Any]
    values: dict[str, Any]
    secrets: set[str]
    stored: dict[str, Any]
    plain: bool


def secret_problem(name: str, err: Any) -> str:
    """A schema violation of a secret parameter, worded without its value."""
    return (f"parameter {name!r}: the value given (secret, not shown) fails "
            f"{err.validator!r}: {secret_rule(err)} of its schema")


def without_secret(schema: Any) -> Any:
    """The schema without planrun's own ``secret`` keyword (JSON Schema does not know it)."""
    if isinstance(schema, dict) and "secret" in schema:
        return {k: v for k, v in schema.items() if k != "secret"}
    return schema


def check_params(raw_params: Any, given: ParamInput, concrete: bool,
                 out: Collector) -> ParamValues:
    """Check each declaration (schema, ``secret``, ``default``), then the values given."""
    declared: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    secrets: set[str] = set()
    good: dict[str, Any] = {}
    for pname, schema in declared.items():
        if isinstance(schema, dict) and _declaration_ok(pname, schema, secrets, out):
            good[pname] = schema  # a schema that is not a mapping: the shape check says so
    values = _resolve(good, given, concrete, out, secrets)
    for pname in set(declared) - set(good):
        values[pname] = UNKNOWN
    stored = {k: v if v is UNKNOWN else (redact.reference(k) if k in secrets
                                         else redact.escape_value(v))
              for k, v in values.items()}
    plain = not secrets and not any(redact.has_marks(v) for v in values.values()
                                    if v is not UNKNOWN)
    return ParamValues(declared=declared, values=values, secrets=secrets, stored=stored,
                       plain=plain)


def _declaration_ok(pname: str, schema: dict[str, Any], secrets: set[str],
                    out: Collector) -> bool:
    """Check one declaration; add its name to ``secrets`` if it is one. False: bad schema."""
    ptr = pointer("params", pname)
    secret = schema.get("secret", False)
    if not isinstance(secret, bool):
        out.add("schema", f"parameter {pname!r}: 'secret' must be true or false",
                path=ptr + "/secret")
    elif secret:
        secrets.add(pname)
    # a secret's schema may hold its value (a default, an enum): its verdict is not kept
    bad_schema = schema_problems(without_secret(schema), keep=secret is False)
    for sub, msg in bad_schema:
        out.add("schema", f"parameter {pname!r}: {msg}", path=ptr + sub)
    if bad_schema:
        return False
    if "default" in schema:
        for err in strict_validator(without_secret(schema)).iter_errors(schema["default"]):
            out.add("param_type", f"parameter {pname!r}: default {err.message}"
                    if pname not in secrets else secret_problem(pname, err),
                    path=ptr + "/default")
    return True


def _resolve(declared: dict[str, Any], given: ParamInput, concrete: bool,
             out: Collector, secret: set[str]) -> dict[str, Any]:
    """The value of each declared parameter: -p beats --params-file beats the environment."""
    values: dict[str, Any] = {}
    raw: dict[str, Any] = dict(given.file_values)
    cli_names = set(given.cli) | {k for k in given.env
                                  if k in declared and k not in given.file_values}
    for name in sorted((set(given.cli) | set(given.file_values)) - set(declared)):
        out.add("param_unknown",
                f"parameter {name!r} is not declared by this plan."
                f"{out.did_you_mean(name, declared)} "
                f"Declared: {listed(declared) or 'none'}", located=False)
    for name, schema in declared.items():
        if name in cli_names and not _parse_text(name, schema, given, raw, out, secret):
            continue
        if name in raw:
            values[name] = raw[name]
            problems = list(strict_validator(without_secret(schema)).iter_errors(raw[name]))
            for err in problems:
                out.add("param_type", f"parameter {name!r}: {err.message}"
                        if name not in secret else secret_problem(name, err),
                        located=False)
            if problems:
                values[name] = UNKNOWN
        elif isinstance(schema, dict) and "default" in schema:
            values[name] = schema["default"]
        elif concrete:
            out.add("param_missing",
                    f"parameter {name!r} is required and has no value: give -p {name}=VALUE "
                    "or --params-file", path=pointer("params", name), key=True)
            values[name] = UNKNOWN
        else:
            values[name] = UNKNOWN
    return values


def _parse_text(name: str, schema: Any, given: ParamInput, raw: dict[str, Any],
                out: Collector, secret: set[str]) -> bool:
    """Parse a -p or environment text into ``raw[name]``; False (and an issue) if it fails."""
    text = given.cli.get(name, given.env.get(name))
    assert text is not None
    if has_surrogate(text):
        out.add("param_type", f"parameter {name!r}: the value is not UTF-8 text "
                "(it holds bytes that do not decode); give it as UTF-8", located=False)
        return False
    try:
        raw[name] = parse_cli_value(text, schema)
    except ValueError as exc:
        why = str(exc) if name not in secret else (
            "the value given (secret, not shown) does not parse as its declared "
            f"type {json.dumps(schema.get('type') if isinstance(schema, dict) else None)}")
        out.add("param_type", f"parameter {name!r}: {why}", located=False)
        return False
    return True
