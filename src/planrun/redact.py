"""Secrets: references in stored data, masks in printed text (SPEC §7).

The value of a ``secret: true`` parameter lives only in the memory of the process that was
given it (``-p``, ``--params-file``, ``PLANRUN_PARAM_<NAME>``) and in the arguments a tool
is called with. Everything else holds the **reference form**:

* Stored data (arguments, outputs, errors, events, parameters, the plan's secret defaults)
  holds a *reference* where a secret's value was: ``U+FDD0 NAME[:FORM][/POINTER] U+FDD1``.
  U+FDD0..U+FDD2 are Unicode noncharacters, which the standard reserves for a program's
  internal use; a value that happens to contain one is stored with it escaped (U+FDD2
  before it), so a value can never be mistaken for a reference and every value reads
  back exactly. Idempotency keys and approval digests are computed over this form, so
  nothing in the journal depends on a secret's value (nothing to guess it from).
* :func:`reveal` puts the values given to *this* process back in, just before a call (and
  for ``when``): resume, retry and replay give later steps exactly what a clean run would.
* Text a tool produced (its output, exception, stderr tail) may echo a secret: it is put
  in reference form by scanning (:meth:`Secrets.conceal`; the run's :class:`Secrets`
  are passed to where text enters planrun), in every spelling planrun can recognise —
  as written, JSON-escaped (ASCII or not), Python ``repr`` — and numbers where they
  stand alone.
* Printing shows ``***`` for a reference (:func:`display`): only values are ever masked,
  never field names, run ids, step ids, codes or planrun's own words, since those never
  hold a reference. A tool's own writes to stdout/stderr while a run is driven are values
  too: :func:`planrun.masking.masked_output` masks them on their way to planrun's stderr.

A ``FORM`` says how the value was spelt where it was found: none (the value itself; as a
whole string it is the value with its own type, inside text its text), ``text`` (a
number's JSON spelling inside text), ``json``/``jsonu`` (JSON-escaped, ASCII or not),
``repr`` (Python ``repr``), ``float``/``int`` (a number leaf of the other numeric type).
``/POINTER`` (JSON Pointer) names a leaf of an object or array secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .pointers import leaves, pointer_of, split_pointer

#: What a person sees where a secret's value was.
MASK = "***"
OPEN, CLOSE, ESC = "\ufdd0", "\ufdd1", "\ufdd2"
_MARK = re.compile("[\ufdd0-\ufdd2]")
#: An escaped character | a reference | a stray marker (a cut reference; dropped).
_PARSE = re.compile("\ufdd2([\\s\\S])|\ufdd0((?:[^\ufdd0-\ufdd2]|\ufdd2[\\s\\S])*)\ufdd1"
                    "|[\ufdd0-\ufdd2]")
_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)(?::([a-z]+))?(/.*)?", re.DOTALL)
_FORMS = ("", "text", "json", "jsonu", "repr", "float", "int")


class SecretMissing(LookupError):
    """A reference names a secret parameter that has no value in this process."""


# --- the reference form ------------------------------------------------------------------


def escape(text: str) -> str:
    """``text`` with the marker characters escaped (a literal value in reference form)."""
    if not _MARK.search(text):
        return text
    return _MARK.sub(lambda m: ESC + m.group(), text)


def reference(name: str, form: str = "", pointer: str = "") -> str:
    """The reference to parameter ``name`` (a leaf at ``pointer``), spelt as ``form``."""
    assert form in _FORMS
    return OPEN + name + (":" + form if form else "") + escape(pointer) + CLOSE


def reference_name(value: Any) -> str | None:
    """The parameter name when ``value`` is exactly one plain reference, else None."""
    whole = _whole(value)
    return whole[0] if whole is not None and not whole[1] else None


def _unescape(text: str) -> str:
    return re.sub("\ufdd2([\\s\\S])", r"\1", text) if ESC in text else text


def escape_value(value: Any) -> Any:
    """A JSON value from outside (a plan, a person) in reference form: markers escaped."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escape(k): escape_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_value(v) for v in value]
    return value


def has_marks(value: Any) -> bool:
    """True when a string (or object key) anywhere in ``value`` holds a marker character."""
    if isinstance(value, str):
        return _MARK.search(value) is not None
    if isinstance(value, dict):
        return any(has_marks(k) or has_marks(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_marks(v) for v in value)
    return False


_MARK_SPELT = re.compile(r"[\ufdd0-\ufdd2]|\\(?:u|U0000)[fF][dD][dD][0-2]")


def text_may_hold_marks(text: str) -> bool:
    """False when a JSON/YAML source ``text`` cannot hold a marker character (escaped or not)."""
    return _MARK_SPELT.search(text) is not None


def holds_reference(value: Any) -> bool:
    """True when ``value`` (a JSON value, possibly holding templates) has a reference."""
    from .params import Template

    if isinstance(value, str):
        return OPEN in value and any(m.group(2) is not None for m in _PARSE.finditer(value))
    if isinstance(value, Template):
        return any(holds_reference(s) for s in value.segments if isinstance(s, str))
    if isinstance(value, dict):
        return any(holds_reference(k) or holds_reference(v) for k, v in value.items())
    if isinstance(value, list):
        return any(holds_reference(v) for v in value)
    return False


def hides(stored: Any, loc: Iterable[Any]) -> bool:
    """True when the value at ``loc`` of ``stored`` holds a secret (or cannot be found).

    Used to word a contract violation without the value it would quote.
    """
    value = stored
    for tok in loc:
        found = (isinstance(value, list) and isinstance(tok, int) and 0 <= tok < len(value)
                 ) or (isinstance(value, dict) and tok in value)
        if not found:
            return True
        value = value[tok]
    return holds_reference(value)


# --- stored plans and parameters ------------------------------------------------------------


def stored_plan(document: Any) -> Any:
    """The plan document as stored: each secret parameter's ``default`` is a reference.

    Returns ``document`` itself when it has no secret default.
    """
    params = document.get("params") if isinstance(document, dict) else None
    if not isinstance(params, dict):
        return document
    secret = [n for n, s in params.items() if isinstance(s, dict) and s.get("secret") is True
              and "default" in s]
    if not secret:
        return document
    return {**document, "params": {
        n: ({**s, "default": reference(n)} if n in secret else s) for n, s in params.items()}}


def loaded_plan(document: Any) -> Any:
    """A stored plan document with the references standing for secret defaults removed.

    The value of a secret default is not in the journal: a resumed run is given it again.
    """
    params = document.get("params") if isinstance(document, dict) else None
    if not isinstance(params, dict):
        return document
    stored = [n for n, s in params.items() if isinstance(s, dict) and s.get("secret") is True
              and reference_name(s.get("default")) == n]
    if not stored:
        return document
    return {**document, "params": {
        n: ({k: v for k, v in s.items() if k != "default"} if n in stored else s)
        for n, s in params.items()}}


# --- secrets known to this process ------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _spellings(text: str) -> dict[str, str]:
    """How ``text`` is spelt in each form (only the forms that differ from the text)."""
    out = {"": text}
    for form, spelt in (("json", json.dumps(text)[1:-1]),
                        ("jsonu", json.dumps(text, ensure_ascii=False)[1:-1]),
                        ("repr", repr(text)[1:-1])):
        if spelt not in out.values():
            out[form] = spelt
    return out


#: Characters a secret's spelling needs for a key that holds it (not only one that is it)
#: to be concealed: a key holding a token is the token echoed; one holding a short
#: secret (a PIN, one letter) is far more often a field name that happens to.
KEY_SECRET_CHARS = 8


class Secrets:
    """The secret parameters' values given to this process, and how to find them in text.

    Args:
        values: parameter name → value, for the secret parameters only.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = dict(values)
        self._tokens: dict[str, str] = {}  # a spelling found in text → its reference
        self._keys: dict[str, str] = {}  # an object key that is exactly a secret → reference
        self._numbers: list[tuple[int | float, str, str]] = []
        for name, value in self.values.items():
            for ptr, leaf in leaves(value):
                if _is_number(leaf):
                    self._numbers.append((leaf, name, ptr))
                    text = json.dumps(leaf)
                    self._tokens.setdefault(text, reference(name, "text", ptr))
                    self._keys.setdefault(text, reference(name, "text", ptr))
                elif isinstance(leaf, str) and leaf:
                    for form, spelt in _spellings(leaf).items():
                        self._tokens.setdefault(spelt, reference(name, form, ptr))
                    self._keys.setdefault(leaf, reference(name, "", ptr))
        forms = sorted(self._tokens, key=len, reverse=True)
        self.forms = forms
        self._find = re.compile("|".join([*map(re.escape, forms), "[\ufdd0-\ufdd2]"]))
        self._find_in_keys = re.compile("|".join([
            *map(re.escape, (f for f in forms if len(f) >= KEY_SECRET_CHARS)),
            "[\ufdd0-\ufdd2]"]))
        self._longest = max(map(len, forms), default=0)
        self._within: dict[frozenset[str], Secrets] = {}  # within(): by the names kept

    def __bool__(self) -> bool:
        return bool(self._tokens or self._numbers)

    @property
    def longest(self) -> int:
        """Characters of the longest spelling of a secret found in text (0: none)."""
        return self._longest

    def _swap(self, m: re.Match[str]) -> str:
        found = m.group()
        return self._tokens.get(found) or ESC + found

    def conceal_text(self, text: str, keep: Iterable[str] = ()) -> str:
        """``text`` (a tool's or a library's words) in reference form.

        Substrings in ``keep`` (planrun's own words around the value) are left as they are,
        except one that stands inside a secret: the text is cut at each word kept, and a
        secret cut in pieces would no longer be found (a kept "a" left "banana" in clear).
        """
        keep = [k for k in keep if k and not any(k in f and k != f for f in self.forms)]
        if not keep:
            return self._find.sub(self._swap, text)
        split = re.compile("(" + "|".join(map(re.escape, sorted(keep, key=len,
                                                                  reverse=True))) + ")")
        return "".join(part if i % 2 else self._find.sub(self._swap, part)
                       for i, part in enumerate(split.split(text)))

    def conceal(self, value: Any) -> Any:
        """A JSON value from a tool in reference form (every string, number, exact key)."""
        if isinstance(value, str):
            return self._find.sub(self._swap, value)
        if isinstance(value, dict):
            # A key that is a secret is its reference; one that holds a secret of
            # KEY_SECRET_CHARS characters or more, as text is (a key "k-SECRET" was
            # journaled and shown in clear; found by attack). A shorter one is taken for a
            # coincidence: field names are not garbled by a one-letter secret (SPEC §7).
            return {(self._keys.get(k) or self._find_in_keys.sub(self._swap, k))
                    if isinstance(k, str) else k: self.conceal(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.conceal(v) for v in value]
        if _is_number(value):
            for number, name, ptr in self._numbers:
                if value == number:
                    form = "" if type(value) is type(number) else (
                        "float" if isinstance(value, float) else "int")
                    return reference(name, form, ptr)
        return value

    def within(self, value: Any) -> Secrets:
        """Only the secrets ``value`` holds somewhere (a call's arguments), by parameter.

        What a call sent to another host may carry: a secret the call was not given is
        no business of that host's (SPEC §12; found by an attacker: every call sent to a
        Dask worker carried every secret of the run). A number, or text in any spelling
        that masking finds, counts; a leaf found by chance (a short secret inside longer
        text) keeps its secret, never the other way round.
        """
        if not self.values:
            return self
        blob = "\n".join((json.dumps(value, ensure_ascii=False, default=str),
                          json.dumps(value, default=str), repr(value)))
        names = frozenset(
            name for name, secret in self.values.items()
            if any(spelt in blob for _ptr, leaf in leaves(secret)
                   for spelt in (_spellings(leaf).values() if isinstance(leaf, str) and leaf
                                 else [json.dumps(leaf)] if _is_number(leaf) else [])))
        if len(names) == len(self.values):
            return self
        found = self._within.get(names)
        if found is None:
            found = self._within[names] = Secrets({n: self.values[n] for n in names})
        return found

    @classmethod
    def of_plan(cls, plan: Any) -> Secrets:
        """The secrets of a checked plan (values not known are left out)."""
        from .params import UNKNOWN

        return cls({n: plan.params[n] for n in sorted(plan.secret_params)
                    if n in plan.params and plan.params[n] is not UNKNOWN})


#: No secrets: what text is concealed with outside a run (markers are still escaped).
NO_SECRETS = Secrets({})


def conceal_tail(data: bytes, secrets: Secrets, size: int) -> str:
    """The last ``size`` characters of ``data`` in reference form, no part of a secret kept.

    ``data`` is UTF-8 (bytes that do not decode become U+FFFD). A window of the bytes is
    decoded that holds at least ``size`` characters more than the longest spelling of a
    secret; the secrets in it are concealed; then the start of the window, where the end
    of a secret the window cut off may stand unrecognised, is dropped (as long as the
    longest spelling), and the last ``size`` characters kept, never cutting a reference
    (:func:`cut_tail`). Cutting first and concealing after, or counting the window in
    bytes and the tail in characters, left the end of a secret in clear (found by attack:
    16 characters of a 36-character secret before 1,520 emoji).
    """
    longest = secrets.longest
    window = tail_window(secrets, size)
    text = secrets.conceal_text(data[-window:].decode("utf-8", "replace"))
    if len(data) > window:  # the window's start may hold the end of a secret
        text = cut_tail(text, max(len(text) - longest - 1, 0))
    return cut_tail(text, size)


def tail_window(secrets: Secrets, size: int) -> int:
    """How many bytes at the end of a text :func:`conceal_tail` decodes for ``size`` characters.

    ``size`` more than the longest spelling of a secret, 4 bytes a character (the most a
    character takes in UTF-8). A reader that keeps only a tail keeps at least one byte
    more, so that the cut is seen.
    """
    return 4 * (size + secrets.longest) + 4


def cut_head(text: str, size: int) -> str:
    """The first ``size`` characters of reference-form ``text``, never cutting a reference.

    A reference (or escape) straddling the cut is dropped whole.
    """
    if len(text) <= size:
        return text
    end = size
    for m in _PARSE.finditer(text):
        if m.start() >= end:
            break
        if m.end() > end:
            end = m.start()
            break
    return text[:end]


def cut_tail(text: str, size: int) -> str:
    """The last ``size`` characters of reference-form ``text``, never cutting a reference.

    A reference (or escape) straddling the cut is dropped whole.
    """
    if len(text) <= size:
        return text
    start = len(text) - size
    for m in _PARSE.finditer(text):
        if m.end() <= start:
            continue
        if m.start() < start:
            start = m.end()
        break
    return text[start:]


# --- back to values: just before a call ------------------------------------------------------


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        raise SecretMissing("an object or array secret cannot stand inside text")
    return json.dumps(value)


def _value(body: str, values: Mapping[str, Any]) -> tuple[str, Any]:
    m = _BODY.fullmatch(_unescape(body))
    if m is None:
        raise SecretMissing(f"malformed reference {body!r} in the journal")
    name, form, ptr = m.group(1), m.group(2) or "", m.group(3) or ""
    if name not in values:
        raise SecretMissing(f"the journal refers to secret parameter {name!r}, which has no "
                            "value in this run; give it again with -p, --params-file or "
                            f"PLANRUN_PARAM_{name}")
    value = values[name]
    for tok in split_pointer(ptr):
        if isinstance(value, dict) and tok in value:
            value = value[tok]
        elif isinstance(value, list) and tok.isdigit() and int(tok) < len(value):
            value = value[int(tok)]
        else:
            raise SecretMissing(f"secret parameter {name!r} has no {ptr!r} in this run")
    return form, value


def _reveal_str(text: str, values: Mapping[str, Any]) -> Any:
    whole = _PARSE.fullmatch(text)
    if whole is not None and whole.group(2) is not None:
        form, value = _value(whole.group(2), values)
        if form == "":
            return value
        if form == "float":
            return float(value)
        if form == "int":
            return int(value)

    def swap(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(1)
        if m.group(2) is None:
            return ""
        form, value = _value(m.group(2), values)
        spelt = _render(value)
        return _spellings(spelt).get(form, spelt) if form not in ("", "text") else spelt

    return _PARSE.sub(swap, text)


def reveal(value: Any, values: Mapping[str, Any]) -> Any:
    """A reference-form JSON value with the secrets' values put back (``values``: by name).

    Raises:
        SecretMissing: a reference names a parameter ``values`` does not hold.
    """
    if isinstance(value, str):
        return _reveal_str(value, values) if _MARK.search(value) else value
    if isinstance(value, dict):
        return {(_render(_reveal_str(k, values)) if isinstance(k, str) and _MARK.search(k)
                 else k): reveal(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v, values) for v in value]
    return value


def _whole(value: Any) -> tuple[str, str] | None:
    """(name, pointer) when ``value`` is exactly one reference to a value itself."""
    if not isinstance(value, str) or not value.startswith(OPEN):
        return None
    m = _PARSE.fullmatch(value)
    if m is None or m.group(2) is None:
        return None
    body = _BODY.fullmatch(_unescape(m.group(2)))
    if body is None or body.group(2):
        return None
    return body.group(1), body.group(3) or ""


def follow(value: Any, path: tuple[str, ...], what: str, values: Mapping[str, Any]) -> Any:
    """:func:`planrun.params.dig` through a reference-form value.

    Where a reference stands for a whole object or array secret, the result is a reference
    to the leaf inside it (checked against the value given).

    Raises:
        planrun.params.ResolveError: the path does not exist.
        SecretMissing: the secret has no value in this process.
    """
    from .params import ResolveError, dig

    for i, tok in enumerate(path):
        if isinstance(value, dict) and tok in value:
            value = value[tok]
            continue
        if isinstance(value, dict):  # a key that is exactly a secret is a reference
            key = next((k for k in value if isinstance(k, str) and OPEN in k
                        and reveal(k, values) == tok), None)
            if key is not None:
                value = value[key]
                continue
        if isinstance(value, list) and tok.isdigit() and int(tok) < len(value):
            value = value[int(tok)]
            continue
        at = ".".join((what, *path[:i])) if i else what
        whole = _whole(value)
        if whole is not None:
            name, ptr = whole
            _form, real = _value(value[1:-1], values)
            dig(real, path[i:], at)  # the path must exist in the value given
            return reference(name, "", ptr + pointer_of(path[i:]))
        raise ResolveError(f"{at} has no {tok!r}")
    return value


def expand(value: Any, values: Mapping[str, Any]) -> Any:
    """A reference to a whole array secret as a list of references to its items.

    Anything else is returned as it is (a ``for_each`` source in reference form).
    """
    whole = _whole(value)
    if whole is None:
        return value
    name, ptr = whole
    _form, real = _value(value[1:-1], values)
    if not isinstance(real, list):
        return value
    return [reference(name, "", f"{ptr}/{i}") for i in range(len(real))]


# --- printing ----------------------------------------------------------------------------------


def _shown(m: re.Match[str]) -> str:
    if m.group(1) is not None:
        return m.group(1)
    return MASK if m.group(2) is not None else ""


def display_text(text: str) -> str:
    """Reference-form text as a person sees it: ``***`` for each secret value."""
    return _PARSE.sub(_shown, text) if _MARK.search(text) else text


def display(value: Any) -> Any:
    """A reference-form JSON value as printed: ``***`` for each secret value."""
    if isinstance(value, str):
        return display_text(value)
    if isinstance(value, dict):
        return {display_text(k) if isinstance(k, str) else k: display(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [display(v) for v in value]
    return value
