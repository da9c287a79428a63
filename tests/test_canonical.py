"""planrun.canonical: canonical JSON (sorted keys, no spaces, NFC, one float spelling)."""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planrun.canonical import canonical_json, digest

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids,
                                                              max_size=4),
    max_leaves=20,
)


def normal(value: Any) -> Any:
    """What canonical JSON means, written independently: NFC text, integral floats as ints."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {unicodedata.normalize("NFC", k): normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    return value


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same value with every object's keys inserted in another order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


@given(JSON_VALUES)
def test_canonical_json_reads_back_as_the_normalised_value(value: Any) -> None:
    text = canonical_json(value)
    assert json.loads(text) == normal(value)


@given(JSON_VALUES)
def test_canonical_json_is_idempotent(value: Any) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


@given(JSON_VALUES, st.randoms(use_true_random=False))
def test_key_order_does_not_matter(value: Any, rnd: random.Random) -> None:
    assert canonical_json(shuffled(value, rnd)) == canonical_json(value)
    assert digest(shuffled(value, rnd)) == digest(value)


@given(JSON_VALUES)
def test_canonical_text_has_sorted_keys_and_no_spaces(value: Any) -> None:
    text = canonical_json(value)
    assert text == json.dumps(normal(value), sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False)


@given(JSON_VALUES)
def test_digest_is_sha256_of_the_utf8_canonical_text(value: Any) -> None:
    expected = hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
    assert digest(value) == expected
    assert len(digest(value)) == 64


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_one_spelling_per_number(f: float) -> None:
    if f.is_integer() and abs(f) < 1e21:
        assert canonical_json(f) == canonical_json(int(f))
        assert digest(f) == digest(int(f))
    else:
        assert canonical_json(f) == repr(f)


def test_examples() -> None:
    assert canonical_json({"b": 1, "a": [2.0, 0.5, -0.0, True, None]}) == \
        '{"a":[2,0.5,0,true,null],"b":1}'
    assert canonical_json(1e21) == "1e+21"
    assert canonical_json(("a", 1)) == '["a",1]'
    assert canonical_json({"k": "é"}) == '{"k":"é"}'  # UTF-8, not \\u escapes


def test_nfc_for_strings_and_keys() -> None:
    nfd = unicodedata.normalize("NFD", "café")
    assert nfd != "café"
    assert canonical_json({nfd: nfd}) == canonical_json({"café": "café"})
    assert digest([nfd]) == digest(["café"])


def test_booleans_are_not_numbers() -> None:
    assert digest(True) != digest(1)
    assert digest(False) != digest(0)
    assert digest("1") != digest(1)
    assert digest([1, 2]) != digest([2, 1])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), [float("-inf")],
                                   {"a": float("nan")}])
def test_nan_and_infinity_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json(value)


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", object(), {"a": [1, {2, 3}]}])
def test_non_json_data_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


# --- the idempotency key from the arguments' canonical text (one writing for two digests) --

NAMES = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8)


@given(args=st.dictionaries(NAMES, JSON_VALUES, max_size=4), plan=NAMES, step=NAMES,
       tool=NAMES, item=st.none() | st.integers(0, 10**6), root=NAMES,
       dedupe=st.sampled_from([None, "run", "plan"]))
def test_the_spliced_key_is_the_key_of_the_whole_envelope(
        args: dict[str, Any], plan: str, step: str, tool: str, item: int | None, root: str,
        dedupe: str | None) -> None:
    """Giving ``arguments_json`` changes nothing: journals keep their keys (SPEC §7)."""
    from types import SimpleNamespace

    from planrun.execution.common import idempotency_key

    checked: Any = SimpleNamespace(id=step, tool=SimpleNamespace(
        name=tool, entry=SimpleNamespace(key_arguments=None, dedupe=dedupe)))
    scope = {"scope": "plan"} if dedupe == "plan" else {"root_run_id": root}
    whole = digest({"plan": plan, **scope, "step": step, "item": item, "tool": tool,
                    "arguments": args})
    assert idempotency_key(plan=plan, root_run_id=root, step=checked, item=item,
                           arguments=args) == whole
    assert idempotency_key(plan=plan, root_run_id=root, step=checked, item=item,
                           arguments=args, arguments_json=canonical_json(args)) == whole
    # with key_arguments the subset counts, whatever text is given
    checked.tool.entry.key_arguments = sorted(args)[:1]
    subset = {k: args[k] for k in sorted(args)[:1]}
    assert idempotency_key(plan=plan, root_run_id=root, step=checked, item=item,
                           arguments=args, arguments_json=canonical_json(args)) == digest(
        {"plan": plan, **scope, "step": step, "item": item, "tool": tool,
         "arguments": subset})
