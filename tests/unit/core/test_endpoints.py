"""The endpoints hash records (asyncrl/core/net/endpoints.py): their format, the older plain format, and
which endpoints ``asyncrl status`` may scrape from where it runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import subprocess
import sys

import pytest

from asyncrl.core.config.network import NetworkConfig
from asyncrl.core.net.endpoints import Endpoint, Place, launcher_role, parse_endpoint

NODE_A = Place("nodeA", "10.0.0.5", "boot-a/4026531840")


@pytest.mark.parametrize(
    "endpoint",
    [
        Endpoint("actor3", "127.0.0.1:9495", NODE_A, 4242),
        Endpoint("actor4", "127.0.0.1:9496", NODE_A, 4243, "2,3"),
        Endpoint("learner", "127.0.0.1:9491", Place("nodeA"), 0),
        Endpoint("actor1", "127.0.0.1:9493", None),  # an older version's plain host:port
    ],
)
def test_a_record_reads_back_as_written(endpoint):
    assert parse_endpoint(endpoint.role, endpoint.to_json()) == endpoint


def test_the_record_is_json_with_the_documented_fields():
    value = json.loads(Endpoint("actor3", "127.0.0.1:9495", NODE_A, 4242).to_json())
    assert value == {
        "metrics": "127.0.0.1:9495",
        "host": "nodeA",
        "address": "10.0.0.5",
        "netns": "boot-a/4026531840",
        "pid": 4242,
    }


def test_gpus_are_recorded_only_when_the_process_has_some():
    value = json.loads(Endpoint("actor4", "127.0.0.1:9496", NODE_A, 4243, "2,3").to_json())
    assert value["gpus"] == "2,3"
    assert "gpus" not in json.loads(Endpoint("l", "127.0.0.1:1", NODE_A).to_json())
    assert parse_endpoint("l", '{"metrics": "127.0.0.1:1", "gpus": 3}').gpus == ""


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("127.0.0.1:9491", Endpoint("learner", "127.0.0.1:9491", None)),
        ("9491", Endpoint("learner", "9491", None)),  # JSON, but not a record: taken as is
        ('{"metrics": "127.0.0.1:9491"}', Endpoint("learner", "127.0.0.1:9491", Place(""))),
        (
            '{"metrics": "127.0.0.1:9491", "host": "nodeA", "pid": "12"}',
            Endpoint("learner", "127.0.0.1:9491", Place("nodeA"), 0),
        ),
    ],
)
def test_older_and_partial_values_still_parse(raw, want):
    assert parse_endpoint("learner", raw) == want


def test_a_loopback_is_shared_by_one_kernel_and_network_namespace():
    same_ns_other_name = dataclasses.replace(NODE_A, host="renamed")
    other_ns_same_name = dataclasses.replace(NODE_A, netns="boot-a/4026532177")
    other_machine = Place("nodeB", "10.0.0.7", "boot-b/4026531840")
    assert NODE_A.shares_loopback(same_ns_other_name)
    assert not NODE_A.shares_loopback(other_ns_same_name)  # e.g. tests/multihost's hosts
    assert not NODE_A.shares_loopback(other_machine)  # the same root namespace inode
    # without /proc on one side only the host names can tell
    assert NODE_A.shares_loopback(Place("nodeA"))
    assert not NODE_A.shares_loopback(Place("nodeB"))


def test_only_an_older_value_or_a_place_sharing_our_loopback_is_scrapable():
    assert Endpoint("actor0", "127.0.0.1:9492", NODE_A).scrapable_from(NODE_A)
    assert Endpoint("actor0", "127.0.0.1:9492", None).scrapable_from(NODE_A)
    elsewhere = Endpoint("actor0", "127.0.0.1:9492", Place("nodeB", "", "boot-b/1"))
    assert not elsewhere.scrapable_from(NODE_A)


def test_a_place_is_described_by_its_name_and_a_telling_address():
    assert NODE_A.describe() == "nodeA (10.0.0.5)"
    assert Place("nodeA", "127.0.0.1").describe() == "nodeA"
    assert Place("nodeA.cluster", "nodeA.cluster").describe() == "nodeA.cluster"


def test_launchers_are_named_per_host():
    here = socket.gethostname()
    assert launcher_role("actors", NetworkConfig()) == f"launcher-actors@{here}"
    assert launcher_role("actors", NetworkConfig(bind="10.0.0.7")) == "launcher-actors@10.0.0.7"
    spread = NetworkConfig(bind="0.0.0.0", advertise="10.0.0.8")
    assert launcher_role("learner", spread) == "launcher-learner@10.0.0.8"


def test_a_process_in_another_network_namespace_is_another_place():
    """``ip netns exec`` hosts (tests/multihost) share the host name but not 127.0.0.1."""
    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` binary (util-linux) to start a process in a new netns")
    code = "import dataclasses, json; from asyncrl.core.net.endpoints import Place; "
    code += "print(json.dumps(dataclasses.asdict(Place.here())))"
    cmd = ["unshare", "--net", sys.executable, "-c", code]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"cannot make a network namespace here (needs root): {r.stderr.strip()}")
    there, here = Place(**json.loads(r.stdout)), Place.here()
    assert there.host == here.host and there.netns and here.netns
    assert not there.shares_loopback(here)
    assert Place.here().shares_loopback(here)
