"""Value conversion of the command-line parameters without pydantic (issue 16, start-up).

Decision: planrun replaces, on each parameter of the commands it converts, the object
Typer uses to convert a value (``_runtime_param``) by :class:`PlanrunParam`, which
converts the kinds planrun's commands use in plain Python and hands everything else back
to Typer.

Why: Typer 0.29 converts every parameter's value with a pydantic ``TypeAdapter``
(``typer._coercion.build_runtime_param`` imports ``typer._adapters`` and so pydantic). It
builds it lazily but for every parameter that is processed, a value given or not (a
``None`` default included), so every command paid for pydantic: ~140 ms of a ~570 ms
``planrun validate`` on a slow machine (``python -X importtime``). Typer has no public
switch: a ``parser=`` still builds an adapter around the parser.

What it converts (the annotations of planrun's commands, Typer's descriptor having
already dropped ``Optional``): ``str`` (a ``str`` is kept as is), ``bool`` (a ``bool``
only), ``int`` in its canonical decimal form (``-?(0|[1-9][0-9]{0,17})``) inside the
parameter's ``min``/``max``, ``float`` written as plain decimals (no exponent, ``inf`` or
``nan``, at most 15 digits each side of the point) strictly inside its bounds, an
``Enum`` (Typer's own ``coerce_cli_choice``), ``Path`` itself (``Path(value)`` and then
Typer's own ``coerce_cli_path``), and ``list``/``tuple`` of those (``Literal`` and
``datetime`` are not used by planrun and stay Typer's). Everything else, and
every value it cannot decide with certainty (``" 7"``, ``"007"``, ``"1e3"``, a bound
reached or passed, a choice that is not one, a conversion that raised), goes to Typer's
own ``build_runtime_param(descriptor)`` (built on first need, then kept): the result and
the error message are then exactly Typer's, at pydantic's price. tests/test_cli_coercion.py
checks, for every parameter of every command, that both give the same value.

What guards it (this is Typer's private API): :func:`install` feature-detects everything
it reads or writes — ``typer.core._TyperParameter`` with ``get_runtime_param``, the
``_runtime_param`` slot still ``None``, ``typer._coercion.RuntimeParam`` (a dataclass with
the fields ``parameter_info`` and ``annotation`` and an abstract ``_coerce_value``),
``TypeDescriptor`` with the fields read here, ``build_runtime_param``, and the
``typer._param_types`` helpers a kind uses. If anything is not as expected it installs
nothing for that parameter (or for any), so Typer's own conversion runs: slower, never
wrong, never a crash. A parameter with a ``parser``, a file type, ``clamp``, a
``path_type`` or any other annotation is left to Typer. tests/test_cli_coercion.py fails
if the fast path stops being installed.

Where (:mod:`.app`): the root group installs it on its own parameters before parsing them
(``LazyGroup.parse_args``; Typer adds the completion options after making the group), on
a command when it converts it (``_build``) and on the command about to run, help option
included (``LazyGroup.resolve_command``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, get_args, get_origin

#: A converter's answer when it cannot decide: Typer's own conversion decides.
_UNDECIDED: Any = object()
#: The longest integer (in digits) converted here; longer ones go to Typer.
_INT_DIGITS = 18
#: The most digits on each side of a float's point converted here.
_FLOAT_DIGITS = 15

_Converter = Callable[[Any, Any, Any], Any]  # (value, param, ctx) -> value or _UNDECIDED
_fast_class: list[type[Any] | None] = []  # built on first use: [PlanrunParam] or [None]


def install(command: Any, ctx: Any = None) -> int:
    """Give each parameter of ``command`` (and of its subcommands) planrun's conversion.

    Args:
        command: a Typer (click) command or group, as ``typer.main.get_command`` makes it.
        ctx: the context ``command`` runs in (its own, or its parent's when it is about to
            be run): its help option (made per context names, and converted too: its value
            is ``None`` when not given) gets planrun's conversion as well. None: only
            ``command.params``.

    Returns:
        How many parameters got it (0 when Typer is not as expected: its own conversion
        then runs unchanged). Never raises.
    """
    try:
        cls = _param_class()
        if cls is None:
            return 0
        return sum(_install_one(cls, param) for param in _params(command, ctx))
    except Exception:  # Typer changed shape: leave its conversion untouched
        return 0


def _params(command: Any, ctx: Any) -> Iterable[Any]:
    yield from getattr(command, "params", ())
    if ctx is not None:
        help_option = _help_option(command, ctx)
        if help_option is not None:
            yield help_option
    commands = getattr(command, "commands", None)
    if isinstance(commands, dict):  # a group's own subcommands (`policy check`)
        for sub in commands.values():
            yield from _params(sub, ctx)


def _help_option(command: Any, ctx: Any) -> Any:
    """``command``'s help option as it will be in its context, or None if unsure.

    Typer makes it once per command from the context's ``help_option_names``, which a
    command's context inherits from its parent unless its ``context_settings`` set them.
    """
    settings = getattr(command, "context_settings", None)
    if getattr(ctx, "command", None) is not command and (
            not isinstance(settings, dict) or "help_option_names" in settings):
        return None
    get = getattr(command, "get_help_option", None)
    return get(ctx) if callable(get) else None


def _install_one(cls: type[Any], param: Any) -> bool:
    from typer import _coercion
    from typer.core import _TyperParameter

    if not isinstance(param, _TyperParameter) or "_runtime_param" not in vars(param):
        return False
    if param._runtime_param is not None:
        return False
    descriptor = getattr(param, "type_descriptor", None)
    if not isinstance(descriptor, _coercion.TypeDescriptor):
        return False
    convert = _converter(descriptor)
    if convert is None:
        return False
    param._runtime_param = cls(descriptor, convert)
    return True


def _param_class() -> type[Any] | None:
    """:class:`PlanrunParam`, or None when Typer's classes are not as expected."""
    if not _fast_class:
        try:
            _fast_class.append(_make_class())
        except Exception:
            _fast_class.append(None)
    return _fast_class[0]


def _make_class() -> type[Any] | None:
    from typer import _coercion, core

    base = getattr(_coercion, "RuntimeParam", None)
    build: Any = getattr(_coercion, "build_runtime_param", None)
    descriptor = getattr(_coercion, "TypeDescriptor", None)
    typer_param = getattr(core, "_TyperParameter", None)
    if not (isinstance(base, type) and dataclasses.is_dataclass(base) and callable(build)
            and isinstance(descriptor, type) and dataclasses.is_dataclass(descriptor)
            and isinstance(typer_param, type)
            and callable(getattr(typer_param, "get_runtime_param", None))):
        return None
    if ({f.name for f in dataclasses.fields(base)} != {"parameter_info", "annotation"}
            or "_coerce_value" not in getattr(base, "__abstractmethods__", ())
            or not callable(getattr(base, "coerce", None))
            or not {"annotation", "parameter_info", "file_annotation"}
            <= {f.name for f in dataclasses.fields(descriptor)}):
        return None

    class PlanrunParam(base):  # type: ignore[valid-type,misc]
        """Typer's ``RuntimeParam`` converting in plain Python, else through Typer's own.

        ``coerce`` (Typer's: ``None``, a string given to a repeated option) is inherited;
        ``_coerce_value`` converts or delegates. Not a dataclass of its own (making one
        costs more than the rest of :func:`install`): Typer's fields are set by its
        ``__init__``, planrun's three by ``object.__setattr__`` (the base is frozen).
        """

        descriptor: Any
        convert: _Converter
        typer_param: list[Any]

        def __init__(self, descriptor: Any, convert: _Converter) -> None:
            super().__init__(parameter_info=descriptor.parameter_info,
                             annotation=descriptor.annotation)
            object.__setattr__(self, "descriptor", descriptor)
            object.__setattr__(self, "convert", convert)
            object.__setattr__(self, "typer_param", [])

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                result = self.convert(value, param, ctx)
            except Exception:
                result = _UNDECIDED
            if result is not _UNDECIDED:
                return result
            return self.typer()._coerce_value(value, param=param, ctx=ctx)

        def typer(self) -> Any:
            """Typer's own ``RuntimeParam`` of this parameter (built on first use)."""
            if not self.typer_param:
                self.typer_param.append(build(self.descriptor))
            return self.typer_param[0]

    return PlanrunParam


# --- the converters -------------------------------------------------------------------------

def _converter(descriptor: Any) -> _Converter | None:
    """The plain-Python converter of ``descriptor``'s annotation, or None (Typer's own)."""
    if descriptor.file_annotation is not None:
        return None
    info = descriptor.parameter_info
    annotation = descriptor.annotation
    origin = get_origin(annotation)
    if origin is list:
        args = get_args(annotation)
        leaf = _leaf(args[0], info) if len(args) == 1 else None
        return None if leaf is None else _list_of(leaf)
    if origin is tuple:
        leaves = [_leaf(arg, info) for arg in get_args(annotation)]
        if not leaves or any(leaf is None for leaf in leaves):
            return None
        return _tuple_of([leaf for leaf in leaves if leaf is not None])
    return _leaf(annotation, info)


def _leaf(annotation: Any, info: Any) -> _Converter | None:
    # The order of typer._adapters.build_leaf_adapter: parser, Enum, Literal, datetime,
    # numbers, bool, str, then paths.
    if getattr(info, "parser", None) is not None or not hasattr(info, "case_sensitive"):
        return None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _choice(tuple(annotation), case_sensitive=info.case_sensitive)
    if annotation is int or annotation is float:
        bounds = (getattr(info, "min", _UNDECIDED), getattr(info, "max", _UNDECIDED))
        if getattr(info, "clamp", True) or not all(
                b is None or _exact_bound(b, annotation) for b in bounds):
            return None
        return (_int if annotation is int else _float)(*bounds)
    if annotation is bool:
        return _bool
    if annotation is str:
        return _str
    if annotation is Path:
        return _path(annotation, info)
    return None


def _exact_bound(bound: Any, annotation: type[Any]) -> bool:
    """Whether comparing a value with ``bound`` in Python is what pydantic does too."""
    if type(bound) is int:
        return annotation is int or abs(bound) < 2**53  # an int a float holds exactly
    return type(bound) is float and annotation is float


def _str(value: Any, param: Any, ctx: Any) -> Any:
    return value if type(value) is str else _UNDECIDED


def _bool(value: Any, param: Any, ctx: Any) -> Any:
    return value if type(value) is bool else _UNDECIDED


def _int(low: float | None, high: float | None) -> _Converter:
    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if type(value) is not str:
            return _UNDECIDED
        digits = value[1:] if value.startswith("-") else value
        if not (digits.isascii() and digits.isdigit() and len(digits) <= _INT_DIGITS
                and (digits == "0" or digits[0] != "0")):
            return _UNDECIDED
        number = int(value)
        if (low is not None and number < low) or (high is not None and number > high):
            return _UNDECIDED  # Typer's message names the bound
        return number

    return convert


def _float(low: float | None, high: float | None) -> _Converter:
    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if type(value) is not str:
            return _UNDECIDED
        whole, point, fraction = (value[1:] if value.startswith("-") else value).partition(".")
        for part in (whole, fraction) if point else (whole,):
            if not (part.isascii() and part.isdigit() and len(part) <= _FLOAT_DIGITS):
                return _UNDECIDED
        if len(whole) > 1 and whole[0] == "0":
            return _UNDECIDED
        number = float(value)
        if (low is not None and not number > low) or (high is not None and not number < high):
            return _UNDECIDED  # at or past a bound: Typer decides
        return number

    return convert


def _choice(choices: tuple[Any, ...], *, case_sensitive: Any) -> _Converter | None:
    from typer import _param_types

    pick = getattr(_param_types, "coerce_cli_choice", None)
    if not callable(pick) or type(case_sensitive) is not bool:
        return None

    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if not (type(value) is str or any(value is c for c in choices)):
            return _UNDECIDED
        return pick(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)

    return convert


def _path(annotation: type[Path], info: Any) -> _Converter | None:
    from typer import _param_types

    check = getattr(_param_types, "coerce_cli_path", None)
    if not callable(check) or getattr(info, "path_type", True) is not None:
        return None

    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if type(value) is not str:
            return _UNDECIDED
        return check(annotation(value), info, path_type=annotation, param=param, ctx=ctx)

    return convert


def _list_of(leaf: _Converter) -> _Converter:
    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            return _UNDECIDED
        out = [leaf(item, param, ctx) for item in value]
        return _UNDECIDED if any(item is _UNDECIDED for item in out) else out

    return convert


def _tuple_of(leaves: list[_Converter]) -> _Converter:
    def convert(value: Any, param: Any, ctx: Any) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) != len(leaves):
            return _UNDECIDED
        out = tuple(leaf(item, param, ctx) for leaf, item in zip(leaves, value, strict=True))
        return _UNDECIDED if any(item is _UNDECIDED for item in out) else out

    return convert
