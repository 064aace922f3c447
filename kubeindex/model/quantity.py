"""Kubernetes resource quantities ("100m", "1.5Gi", "2e3") as exact integers of nano-units."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from functools import lru_cache

NANO = 10**9

_SUFFIX = {
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
    "P": Decimal("1e15"), "E": Decimal("1e18"),
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}
_LIMIT = Decimal(2**63)
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


class QuantityError(ValueError):
    pass


@lru_cache(maxsize=4096)  # real clusters use few distinct request strings: parsing is O(1) amortized
def parse_nano(text: str | int | float) -> int:
    """Quantity -> integer number of nano-units (rounded up, as Kubernetes does)."""
    if isinstance(text, int | float):
        return int(Decimal(str(text)) * NANO)
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"invalid quantity {text!r}")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number + (exponent or "")) * _SUFFIX[suffix or ""]
    except InvalidOperation as err:
        raise QuantityError(f"invalid quantity {text!r}") from err
    if abs(value) > _LIMIT:  # beyond anything real (Kubernetes itself caps at int64)
        raise QuantityError(f"quantity {text!r} out of range")
    return int((value * NANO).to_integral_value(rounding=ROUND_CEILING))


def parse_or_zero(text: str | int | float) -> int:
    """Bad input in one object's quantity must not stop the index: count it as zero."""
    try:
        return parse_nano(text)
    except (QuantityError, ArithmeticError, ValueError):  # e.g. "1e999999999" overflows
        return 0


_DECIMAL_SUFFIXES = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BINARY_LIKE = ("memory", "hugepages-", "ephemeral-storage")  # resources people read in Ki / Mi / Gi


def _decimal(nano: int) -> str:
    """apimachinery's canonical DecimalSI form: the integer mantissa with the largest power of
    1000 suffix (n, u, m, none, k, M, G, T, P, E) that keeps it exact: 2000 -> 2k, 1.5 -> 1500m."""
    if nano == 0:
        return "0"
    mantissa, exponent = nano, -9
    while mantissa % 10 == 0 and exponent < 18:
        mantissa //= 10
        exponent += 1
    while exponent % 3:  # down to a multiple of 3, as apimachinery does
        mantissa *= 10
        exponent -= 1
    return f"{mantissa}{_DECIMAL_SUFFIXES[exponent]}"


def _binary(nano: int) -> str | None:
    """apimachinery's canonical BinarySI form where it has a suffix (Ki .. Ei): a whole number of
    at least 1 Ki, with the largest exact power of 1024. None otherwise (a bare number parses as
    decimal, whose canonical form is _decimal's)."""
    if nano % NANO:
        return None
    value = nano // NANO
    for suffix, factor in _BINARY:
        if abs(value) >= 1024 and value % factor == 0:
            return f"{value // factor}{suffix}"
    return None


def format_quantity(resource: str, nano: int) -> str:
    """An exact quantity string in apimachinery's canonical form (``resource.MustParse(s).String()
    == s``): decimal suffixes (2k, 1500m, 250u), or for memory-like resources binary ones
    (600Gi) unless the decimal form is shorter (96G rather than 93750000Ki). Never rounded."""
    decimal = _decimal(nano)
    if resource.startswith(_BINARY_LIKE):
        binary = _binary(nano)
        if binary is not None and len(binary) <= len(decimal):
            return binary
    return decimal
