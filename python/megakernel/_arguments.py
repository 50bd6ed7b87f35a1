"""Checks of the Python API's arguments made before they reach the core or a loop: integers the core takes as
fixed-width C++ integers, real numbers, and the lists it takes, so that a value of the wrong form raises MkError naming
the argument rather than nanobind's, float()'s or iteration's TypeError, which names none."""

from __future__ import annotations

import operator
import reprlib
from collections.abc import Iterator
from typing import Any

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
    the half-open range of the C++ type that carries it."""
    try:
        number = operator.index(value)
    except TypeError:
        raise _core.MkError(f"{name} must be a whole number, got {value!r}") from None
    low, high = bounds
    if not low <= number < high:
        raise _core.MkError(f"{name} must be in {_range_text(low, high)}, got {number}")
    return number


def checked_float(value: Any, name: str) -> float:
    """`value` as a float, or MkError naming the argument: float() alone would raise a TypeError naming nothing for
    None, and would take the text "0.5" for a number."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise _core.MkError(f"{name} must be a number, got {reprlib.repr(value)}")


def iterated(values: Any, name: str, expected: str) -> Iterator[Any]:
    """An iterator over `values`; a lone number or None raises MkError naming the argument and what it takes."""
    try:
        return iter(values)
    except TypeError:
        raise _core.MkError(f"{name} must be {expected}, got {reprlib.repr(values)}") from None


def listed(values: Any, name: str, expected: str) -> list[Any]:
    """`values` as a list, checked as iterated() checks them."""
    return list(iterated(values, name, expected))
