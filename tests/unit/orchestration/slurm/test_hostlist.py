"""Slurm's compressed host lists, expanded as ``scontrol show hostnames`` does (the expected
lists are written out by hand)."""

from __future__ import annotations

import pytest

from asyncrl.orchestration.slurm.hostlist import expand


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("n[1-3,7],gpu01", ["n1", "n2", "n3", "n7", "gpu01"]),  # commas inside brackets
        ("n[01-03]", ["n01", "n02", "n03"]),  # zero-padding: the width of the low end
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("a[1-2],b[5,7-8],c", ["a1", "a2", "b5", "b7", "b8", "c"]),  # several groups
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),  # brackets in one item multiply
        ("node-[3]-ib", ["node-3-ib"]),  # text after the bracket
        ("n1.cluster,n2.cluster", ["n1.cluster", "n2.cluster"]),
        (" n[1-2] ", ["n1", "n2"]),
    ],
)
def test_a_host_list_expands_in_order(text, hosts):
    assert expand(text) == hosts


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "an empty host list"),
        ("n[1-3", "a '[' without its ']'"),
        ("n1-3]", "a ']' without its '['"),
        ("n[[1-2]]", "a bracket inside a bracket at character 3"),
        ("n[3-1]", "[3-1]: the range 3-1 runs backwards"),
        ("n[a-b]", "[a-b]: 'a-b' is neither a number nor a range lo-hi"),
        ("n[]", "[]: '' is neither a number nor a range lo-hi"),
        ("n[1,,2]", "[1,,2]: '' is neither a number nor a range lo-hi"),
        ("n1,,n2", "an empty item"),
        ("n1,", "an empty item"),
        ("n[0-100000]", "[0-100000]: the range 0-100000 has more than 100000 hosts"),
    ],
)
def test_a_malformed_host_list_is_refused_saying_what_is_wrong(text, says):
    with pytest.raises(ValueError) as e:
        expand(text)
    assert says in str(e.value)
