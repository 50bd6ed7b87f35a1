"""Checks of the Python API's arguments made before they reach the core or a loop: integers the core takes as
fixed-width C++ integers, real numbers, flags, text, paths and the lists it takes, so that a value of the wrong form
raises MkError naming the argument rather than nanobind's, float()'s, os.fspath()'s or iteration's TypeError, which
names none."""

from __future__ import annotations

import operator
import os
import reprlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _core

INT32 = (-(2**31), 2**31)
INT64 = (-(2**63), 2**63)
UINT64 = (0, 2**64)


def _range_text(low: int, high: int) -> str:
    def power(value: int) -> str:
        if abs(value) < 2:
            return str(value)
        sign = "-" if value < 0 else ""
        return f"{sign}2^{abs(value).bit_length() - 1}"

    return f"[{power(low)}, {power(high)})"


def checked_int(value: Any, name: str, bounds: tuple[int, int]) -> int:
    """`value` as an int (anything with __index__: int, numpy integers), or MkError when it lies outside `bounds`,
    the half-open range of the C++ type that carries it. A bool is refused: True would be taken for 1."""
    try:
        if _is_bool(value):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise _core.MkError(f"{name} must be a whole number, got {value!r}") from None
    low, high = bounds
    if not low <= number < high:
        raise _core.MkError(f"{name} must be in {_range_text(low, high)}, got {number}")
    return number


def checked_float(value: Any, name: str) -> float:
    """`value` as a float, or MkError naming the argument: float() alone would raise a TypeError naming nothing for
    None, and would take the text "0.5" for a number, or True for 1.0."""
    if not isinstance(value, (str, bytes)) and not _is_bool(value):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise _core.MkError(f"{name} must be a number, got {reprlib.repr(value)}")


def checked_bool(value: Any, name: str) -> bool:
    """`value` as a bool (True, False or a numpy bool), or MkError naming the argument: nanobind's TypeError names
    none, and truth testing would take 0, "no" or None for a flag's value without a word."""
    if not _is_bool(value):
        raise _core.MkError(f"{name} must be True or False, got {reprlib.repr(value)}")
    return bool(value)


def checked_str(value: Any, name: str, expected: str = "a str") -> str:
    """`value` when it is a str, else MkError naming the argument and what it takes (nanobind's TypeError names
    none)."""
    if not isinstance(value, str):
        raise _core.MkError(f"{name} must be {expected}, got {reprlib.repr(value)}")
    return value


def checked_name(value: Any, name: str, expected: str = "a str") -> str:
    """checked_str() for a name the core looks up or opens (an engine, a preset, a path), where a NUL character ends
    the C string: the core's message would stop at it ("unknown engine 'cpu"), or nanobind would refuse a path with
    its TypeError."""
    text = checked_str(value, name, expected)
    if "\0" in text:
        raise _core.MkError(f"{name} must not contain a NUL character, got {reprlib.repr(text)}")
    return text


def checked_path(value: Any, name: str) -> str:
    """`value` (a str, bytes or an os.PathLike of either) as a str, checked as checked_name() checks it, or MkError
    naming the argument: os.fspath()'s TypeError names none."""
    try:
        path = os.fsdecode(value)
    except TypeError:
        raise _core.MkError(f"{name} must be a str or os.PathLike, got {reprlib.repr(value)}") from None
    return checked_name(path, name)


def checked_engine(value: Any) -> str:
    """An engine's name as a str; which names exist, the core says ("unknown engine ...")."""
    return checked_name(value, "engine", '"auto", "gpu", "cpu-vm" or "reference"')


def made_by_the_core(value: Any, kind: type, class_name: str, how: str) -> Any:
    """`value` when it is the core's object of `kind`, which a package class wraps; else MkError saying how to make
    one: Model("dir") failed later, on an attribute of the str, with an error naming nothing."""
    if not isinstance(value, kind):
        raise _core.MkError(f"{class_name}() takes no {reprlib.repr(value)}: create one with {how}")
    return value


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def iterated(values: Any, name: str, expected: str) -> Iterator[Any]:
    """An iterator over `values`; a lone number or None raises MkError naming the argument and what it takes."""
    try:
        return iter(values)
    except TypeError:
        raise _core.MkError(f"{name} must be {expected}, got {reprlib.repr(values)}") from None


def listed(values: Any, name: str, expected: str) -> list[Any]:
    """`values` as a list, checked as iterated() checks them."""
    return list(iterated(values, name, expected))
