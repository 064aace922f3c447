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


def format_quantity(resource: str, nano: int) -> str:
    """A compact quantity string for status fields: cpu in cores or millicores, memory-like
    resources with binary suffixes when exact, everything else as a plain number."""
    if nano % NANO:
        return f"{-(-nano // 10**6)}m"  # sub-unit values (cpu) in millis, rounded up
    value = nano // NANO
    if resource == "memory" or resource.startswith(("hugepages-", "ephemeral-storage")):
        for suffix, factor in _BINARY:
            if value and value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)
