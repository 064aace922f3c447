"""Property tests of summary names: valid by apimachinery's DNS-1123 subdomain rule, unique among
everything the service creates, stable while the group or workload lives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.desired import label_claim, node_claim, workload_claim
from reconciler.names import Claim, NameAllocator, hashed_name, is_dns1123_subdomain
from tests.builders import SUBDOMAIN, label_values

# Small alphabets make collisions (`gke` + `pool-a` against `gke-pool` + `a`) likely.
dns_names = st.text(alphabet="ab1-.", min_size=1, max_size=70).filter(
    lambda v: len(v) <= 253 and SUBDOMAIN.fullmatch(v) is not None) | st.just("a" * 253)
kinds = st.sampled_from([("apps", "Deployment"), ("apps", "StatefulSet"), ("batch", "Job"),
                         ("jobset.x-k8s.io", "JobSet"), ("batch.volcano.sh", "Job")])
node_claims = st.builds(node_claim, dns_names, label_values)
workload_claims = st.builds(lambda ns, gk, name: workload_claim(ns, gk[0], gk[1], name),
                            st.sampled_from(["default", "ml"]), kinds, dns_names)
# Label workloads share the namespaces, and often the plain names, of owner workloads.
label_claims = st.builds(label_claim, st.sampled_from(["default", "ml"]),
                         st.sampled_from(["volcano.sh/job-name", "Deployment", "apps/x"]), label_values.filter(bool))
claim_lists = st.lists(node_claims, max_size=25, unique=True) | \
    st.lists(workload_claims | label_claims, max_size=25, unique=True)


def check(names: dict[Claim, str]) -> None:
    for name in names.values():
        assert SUBDOMAIN.fullmatch(name) and len(name) <= 253, name
        assert is_dns1123_subdomain(name)
    scoped = [(c.scope, n) for c, n in names.items()]
    assert len(set(scoped)) == len(scoped), names


@settings(max_examples=300, deadline=None)
@given(claim_lists, claim_lists)
def test_names_valid_unique_and_stable(first: list[Claim], later: list[Claim]) -> None:
    allocator = NameAllocator()
    before = allocator.assign(first)
    check(before)
    everything = list(dict.fromkeys([*later, *first]))  # later claims come first in the input order
    after = allocator.assign(everything)
    check(after)
    assert {c: after[c] for c in first} == before  # a later claim never takes a name away
    survivors = first[::2]
    assert allocator.assign(survivors) == {c: before[c] for c in survivors}  # others going changes nothing
    # A restart (new allocator) reads the names back from the objects that exist.
    assert NameAllocator().assign(everything, {c: [n] for c, n in after.items()}) == after


@given(dns_names, label_values)
def test_hashed_names_are_valid_and_dotless(summarizer: str, value: str) -> None:
    name = hashed_name(f"{summarizer}-{value}", f"{summarizer}\x00{value}")
    assert SUBDOMAIN.fullmatch(name) and len(name) <= 63 and "." not in name


def test_subdomain_rule_edges() -> None:
    assert is_dns1123_subdomain("a.b-c") and is_dns1123_subdomain("a" * 253)
    for bad in ("", "a" * 254, "a..b", "a.-b", "a-.b", "-a", "a-", "A", "a_b", ".a"):
        assert not is_dns1123_subdomain(bad), bad
