"""Kubernetes quantities (kubeindex/model/quantity.py): parsed exactly, formatted as apimachinery does,
and a bad one counted as zero."""

from __future__ import annotations

import re
from functools import cache

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.model.quantity import NANO, QuantityError, format_quantity, parse_nano, parse_or_zero
from tests.paths import CRDS

# apimachinery v0.36.3's canonical strings (resource.NewDecimalQuantity(value, format).String() and
# resource.MustParse(s).String(), a small Go program run on these values): (nano-units, DecimalSI
# form, the BinarySI form where it has a suffix).
CANONICAL = [
    (0, "0", None), (1, "1n", None), (1500, "1500n", None), (10**6, "1m", None), (25 * 10**4, "250u", None),
    (1000000500, "1000000500n", None), (3_500_000_000, "3500m", None), (NANO, "1", None),
    (2 * NANO, "2", None), (1000 * NANO, "1k", None), (1023 * NANO, "1023", None), (1024 * NANO, "1024", "1Ki"),
    (1536 * NANO, "1536", "1536"), (2000 * NANO, "2k", None), (550_000 * NANO, "550k", None),
    (159_250 * 10**6, "159250m", None), (7_962_500 * 10**6, "7962500m", None), (96 * 10**9 * NANO, "96G", "93750000Ki"),
    (644_245_094_400 * NANO, "644245094400", "600Gi"), (32880576 * 1024 * NANO, "33669709824", "32880576Ki"),
    (94_580_335_255 * NANO, "94580335255", None), (2**40 * NANO, "1099511627776", "1Ti"),
    (10**15 * NANO, "1P", "976562500000Ki"), (10**18 * NANO, "1E", "976562500000000Ki"),
    (5 * 10**18 * NANO, "5E", "4882812500000000Ki"), (123_456_789 * NANO, "123456789", None),
]


def test_quantities_are_apimachinerys_canonical_strings() -> None:
    """Every status quantity is a fixed point of apimachinery's parse-and-format: decimal
    suffixes where they are exact (2k, 550k, 250u: never rounded to millis), binary ones for
    memory-like resources where shorter (600Gi, but 96G rather than 93750000Ki)."""
    for nano, decimal, binary in CANONICAL:
        assert format_quantity("cpu", nano) == decimal, nano
        shortest = binary if binary is not None and binary[-1] == "i" and len(binary) <= len(decimal) else decimal
        for resource in ("memory", "ephemeral-storage", "hugepages-2Mi"):
            assert format_quantity(resource, nano) == shortest, (resource, nano)
        assert parse_nano(format_quantity("cpu", nano)) == nano == parse_nano(format_quantity("memory", nano))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**63 * 10**3), st.sampled_from(["cpu", "memory", "pods", "nvidia.com/gpu"]))
def test_quantities_are_exact(nano: int, resource: str) -> None:
    text = format_quantity(resource, nano)
    assert parse_nano(text) == nano, text


def test_bad_quantities_count_as_zero() -> None:
    for bad in ("1e999999999", "1E400000", "abc", "", "1.2.3Gi"):
        assert parse_or_zero(bad) == 0, bad


@cache
def _crd_quantity_pattern() -> re.Pattern[str]:
    """The pattern ClusterResourceClaim's CRD puts on spec.resourceAssignments[].resources values."""
    crd = yaml.safe_load((CRDS / "clusterresourceclaims.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return re.compile(spec["properties"]["resourceAssignments"]["items"]["properties"]["resources"]
                      ["additionalProperties"]["pattern"])


_DIGITS = st.text("0123456789", min_size=1, max_size=4)
_NUMBER = st.one_of(_DIGITS, st.builds("{}.".format, _DIGITS), st.builds("{}.{}".format, _DIGITS, _DIGITS),
                    st.builds(".{}".format, _DIGITS))
_SUFFIX = st.one_of(st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T",
                                     "P", "E", "K", "KI", "i", "mi"]),
                    st.builds("{}{}{}".format, st.sampled_from("eE"), st.sampled_from(["", "+", "-"]),
                              st.text("0123456789", min_size=1, max_size=2)))


@given(st.sampled_from(["", "+", "-"]), _NUMBER, _SUFFIX)
@settings(max_examples=400, deadline=None)
def test_the_claim_crds_pattern_admits_exactly_the_non_negative_quantities_we_read(sign: str, number: str,
                                                                                   suffix: str) -> None:
    """The API server validates a claim's quantities with the CRD's pattern (not CEL's isQuantity(),
    whose cost older API servers refuse); what it admits, the reconciler reads: the same grammar,
    without a minus sign ("-0" included). (Beyond 2^63 units, which no resource has, we count zero.)"""
    text = sign + number + suffix
    try:
        readable = parse_nano(text) >= 0 and sign != "-"
    except QuantityError as err:
        readable = "out of range" in str(err) and sign != "-"
    assert bool(_crd_quantity_pattern().match(text)) == readable, text
