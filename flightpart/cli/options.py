"""Click options made from a daemon's settings value (:mod:`flightpart.server.settings`), and the value made back.

:func:`options_of` adds one option per field made with :func:`~flightpart.settings.setting`, in the fields' order,
with the field's default, help text and type (its annotation, or what the field's metadata says: a path, a least
value, a flag); a field whose type is itself a settings value adds its fields' options. :func:`settings_of` builds
the value from the parsed options, so a command is ``settings_of(Settings, options)`` and nothing is spelled twice.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import Field, fields, is_dataclass
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import click

from .group import flight_address

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
PATHS = {"dir": {"file_okay": False}, "file": {"exists": True, "dir_okay": False}}
"""A setting's ``path``: a directory (made by the daemon when missing), or a file that must exist."""


def options_of(settings: type) -> Callable[[F], F]:
    """A decorator adding to a click command one option per setting of ``settings`` (nested values flattened)."""
    made = list(_options(settings))
    names = [name for name, _ in made]
    if len(names) != len(set(names)):
        raise TypeError(f"{settings.__name__}: a setting's name is used twice")

    def decorate(command: F) -> F:
        for _, option in reversed(made):
            command = option(command)
        return command

    return decorate


def settings_of(settings: type[T], parsed: dict[str, Any]) -> T:
    """The ``settings`` value holding what the options of :func:`options_of` parsed into ``parsed``."""
    hints = get_type_hints(settings)
    values: dict[str, Any] = {}
    for f in fields(settings):  # type: ignore[arg-type]
        if is_dataclass(hints[f.name]):
            values[f.name] = settings_of(hints[f.name], parsed)
        elif "option" in f.metadata:
            values[f.name] = parsed[f.name]
    return settings(**values)


def _options(settings: type) -> Iterator[tuple[str, Callable[[F], F]]]:
    hints = get_type_hints(settings)
    for f in fields(settings):
        kind = hints[f.name]
        if is_dataclass(kind):
            yield from _options(kind)  # type: ignore[arg-type]
        elif "option" in f.metadata:
            yield f.name, _option(f, kind)


def _option(f: Field, kind: Any) -> Callable[[F], F]:
    """The click option of one setting, with the same type, default, help and environment variable as it says."""
    meta = f.metadata
    kwargs: dict[str, Any] = {"default": f.default, "help": meta["help"]}
    for key in ("show_default", "envvar", "metavar"):
        if key in meta:
            kwargs[key] = meta[key]
    base = _base_type(kind)
    if "path" in meta:
        kwargs["type"] = click.Path(**PATHS[meta["path"]])
    elif "min" in meta:
        kwargs["type"] = click.FloatRange(min=meta["min"]) if base is float else click.IntRange(min=meta["min"])
    elif base is bool:
        kwargs["is_flag"] = True
    elif base in (int, float):
        kwargs["type"] = base
    if meta.get("address"):
        kwargs["callback"] = lambda _c, _p, v: v and flight_address(v)
    return click.option(meta["option"], *meta.get("aliases", ()), f.name, **kwargs)


def _base_type(kind: Any) -> Any:
    """``int`` of ``int | None``; a type without None as it is."""
    if get_origin(kind) in (Union, types.UnionType):
        args = [a for a in get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return kind
