"""The GPU plan of one node (asyncrl/orchestration/placement/plan.py): auto and explicit layouts, every refusal,
the CPU case, and this node's GPUs as the launcher finds them (asyncrl/orchestration/placement/gpus.py)."""

from __future__ import annotations

import re

import pytest

from asyncrl.core.config.checks import format_indices, parse_cores, parse_indices
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.orchestration.placement.gpus import node_gpus, plan_node, visible_entries
from asyncrl.orchestration.placement.plan import NO_GPUS, Plan, Request, place, request_for

EIGHT = tuple(str(i) for i in range(8))


def _req(n: int = 8, **kw) -> Request:
    return Request(devices=tuple(str(i) for i in range(n)), **kw)


def _refused(req: Request, *fragments: str) -> str:
    with pytest.raises(ValueError) as e:
        place(req)
    for fragment in fragments:
        assert fragment in str(e.value), str(e.value)
    return str(e.value)


# --- auto layouts ---


def test_run_gives_the_learner_the_first_gpus_and_each_actor_the_next():
    plan = place(_req(learner_ranks=2, actors=2))
    assert plan == Plan(learner=("0", "1"), actors=(("2",), ("3",)))
    assert plan.learner_visible() == "0,1"
    assert [plan.actor_visible(j) for j in range(2)] == ["2", "3"]
    assert plan.describe([0, 1]) == (
        "placement: learner ranks 0-1 on GPUs 0,1; actor 0 on GPU 2; actor 1 on GPU 3"
    )


def test_actors_with_several_gpus_take_consecutive_runs():
    plan = place(_req(learner_ranks=2, actors=3, gpus_per_actor=2))
    assert plan.actors == (("2", "3"), ("4", "5"), ("6", "7"))
    assert plan.describe([4, 5, 6]).endswith("actor 5 on GPUs 4,5; actor 6 on GPUs 6,7")
    assert plan.by_role([4, 5, 6]) == {
        "learner": "0,1", "actor4": "2,3", "actor5": "4,5", "actor6": "6,7",
    }  # fmt: skip


def test_launch_actors_starts_at_gpu_0_and_launch_learner_takes_its_ranks():
    assert place(_req(actors=4)) == Plan(actors=(("0",), ("1",), ("2",), ("3",)))
    assert place(_req(learner_ranks=8)) == Plan(learner=EIGHT)
    assert place(_req(learner_ranks=1)).describe([]) == "placement: learner rank 0 on GPU 0"


def test_indices_map_through_the_launchers_visible_devices():
    """An index counts the GPUs the launcher sees: CUDA_VISIBLE_DEVICES=4,5,6,7 -> 0 is '4'."""
    req = Request(devices=("4", "5", "6", "7"), learner_ranks=1, actors=1, actor_gpus="2")
    assert place(req) == Plan(learner=("4",), actors=(("6",),))


# --- explicit layouts ---


def test_explicit_lists_are_followed_in_their_order():
    req = _req(
        learner_ranks=2, learner_gpus="6,7", actors=2, gpus_per_actor=2, actor_gpus="3,2,0-1"
    )
    assert place(req) == Plan(learner=("6", "7"), actors=(("3", "2"), ("0", "1")))


def test_the_auto_side_takes_the_lowest_gpus_an_explicit_list_leaves_free():
    plan = place(_req(learner_ranks=2, actors=2, actor_gpus="0-1"))
    assert plan == Plan(learner=("2", "3"), actors=(("0",), ("1",)))
    plan = place(_req(learner_ranks=2, learner_gpus="1-2", actors=2))
    assert plan == Plan(learner=("1", "2"), actors=(("0",), ("3",)))


def test_keys_of_a_role_without_gpus_here_are_ignored():
    """One config serves every node: `launch actors` ignores learner.gpus, and back."""
    assert place(_req(learner_gpus="9,9", actors=1)) == Plan(actors=(("0",),))
    assert place(_req(learner_ranks=1, actor_gpus="0")) == Plan(learner=("0",))


# --- refusals ---


def test_a_gpu_listed_twice_is_refused():
    _refused(_req(learner_ranks=3, learner_gpus="0,1,0"), "learner.gpus=0,1,0", "GPU(s) 0 more")
    _refused(_req(actors=2, actor_gpus="2-3,3"), "actor.gpus=2-3,3", "GPU(s) 3 more than once")


def test_an_index_the_node_lacks_is_refused():
    _refused(
        _req(learner_ranks=4, learner_gpus="6-9"),
        "learner.gpus=6-9 names GPU(s) 8-9, but this node has 8 GPU(s)",
        "use indices 0-7",
    )
    _refused(_req(0, actors=1, actor_gpus="0"), "this node has 0 GPU(s)", "set actor.gpus=''")


def test_a_list_of_the_wrong_length_is_refused():
    _refused(
        _req(learner_ranks=2, learner_gpus="0-2"),
        "learner.gpus=0-2 lists 3 GPU(s) but learner.nproc=2 ranks use one each",
        "list 2 or set learner.nproc=3",
    )
    _refused(
        _req(actors=3, gpus_per_actor=2, actor_gpus="0-3"),
        "actor.gpus=0-3 lists 4 GPU(s) but actor.num_actors=3 x actor.tensor_parallel_size=2 use 6",
        "list 6 or set actor.num_actors=2",
    )
    message = _refused(_req(actors=2, gpus_per_actor=2, actor_gpus="0-2"), "use 4: list 4")
    assert "set actor.num_actors" not in message  # 3 GPUs make no whole number of actors


def test_overlapping_lists_are_refused():
    _refused(
        _req(learner_ranks=4, learner_gpus="0-3", actors=4, actor_gpus="2-5"),
        "learner.gpus=0-3 and actor.gpus=2-5 share GPU(s) 2-3",
        "give them disjoint lists",
    )


def test_more_actor_gpus_than_the_node_has_after_the_learner_are_refused():
    _refused(
        _req(learner_ranks=2, learner_gpus="0-1", actors=4, gpus_per_actor=2),
        "actor.num_actors=4 x actor.tensor_parallel_size=2 needs 8 GPU(s) after the learner's 2 "
        "(learner.gpus=0-1), this node has 8: lower actor.num_actors to 3, or give the learner "
        "fewer GPUs (learner.nproc), or start the other actors on another node",
    )
    message = _refused(
        _req(4, actors=5), "needs 5 GPU(s), this node has 4: lower actor.num_actors to 4"
    )
    assert "learner" not in message  # `launch actors`: no learner here to shrink


def test_more_learner_ranks_than_free_gpus_are_refused():
    _refused(
        _req(4, learner_ranks=8),
        "learner.nproc=8 needs 8 GPU(s) (one per rank), this node has 4: lower learner.nproc to 4",
    )
    _refused(
        _req(4, learner_ranks=2, actors=3, actor_gpus="0-2"),
        "besides the actors' 3 (actor.gpus=0-2), this node has 4: lower learner.nproc to 1",
        "give the actors fewer GPUs",
    )


# --- the CPU case ---


def test_no_gpu_and_no_list_is_the_empty_plan():
    plan = place(_req(0, learner_ranks=2, actors=2))
    assert plan == NO_GPUS and plan.empty
    assert plan.learner_visible() is None and plan.actor_visible(0) is None
    assert plan.by_role([0, 1]) == {}
    assert place(_req(8)) == NO_GPUS  # no GPU user here


def test_request_counts_only_gpu_users_on_this_node():
    cpu_learner = load_config(["learner.device=cpu", "actor.num_actors=3"])
    assert request_for(cpu_learner, ("learner", "actors"), EIGHT) == Request(EIGHT, actors=3)
    gpu = load_config(["learner=gpu", "learner.nproc=2", "learner.gpus=0-1", "actor.engine=sim"])
    assert request_for(gpu, ("learner", "actors")) == Request((), 2, "0-1")
    assert not request_for(gpu, ("actors",)).wants_gpus  # simulated actors need none
    assert not request_for(gpu, ("buffer",)).wants_gpus


def test_plan_node_detects_gpus_only_when_a_role_could_use_them():
    def no_detect():
        raise AssertionError("detected GPUs for roles that use none")

    sim = load_config(["learner.device=cpu", "actor.engine=sim"])
    assert plan_node(sim, ("learner", "actors"), no_detect) == NO_GPUS
    cfg = load_config(["learner=gpu", "actor=gpu", "learner.nproc=4", "actor.num_actors=4"])
    plan = plan_node(cfg, ("learner", "actors"), lambda: EIGHT)
    assert plan.describe([0, 1, 2, 3]) == (
        "placement: learner ranks 0-3 on GPUs 0,1,2,3; actor 0 on GPU 4; actor 1 on GPU 5; "
        "actor 2 on GPU 6; actor 3 on GPU 7"
    )


# --- the node's GPUs (no CUDA initialised) ---

SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)
  MIG 1g.10gb     Device  0: (UUID: MIG-cccc)
"""


def test_node_gpus_honours_the_launchers_visible_devices_then_nvidia_smi():
    assert node_gpus({}, lambda: SMI) == ("0", "1")
    assert node_gpus({}, lambda: "") == ()  # no nvidia-smi, or it failed: a CPU node
    assert node_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}, lambda: SMI) == ("4", "5")
    assert node_gpus({"CUDA_VISIBLE_DEVICES": ""}, lambda: SMI) == ()


@pytest.mark.parametrize(
    ("value", "entries"),
    [("", ()), ("0", ("0",)), (" 2, 3 ", ("2", "3")), ("1,-1,2", ("1",)), ("-1", ()),
     ("GPU-aaaa,GPU-bbbb", ("GPU-aaaa", "GPU-bbbb"))],
)  # fmt: skip
def test_visible_entries_read_as_cuda_does(value, entries):
    assert visible_entries(value) == entries


# --- the GPU-list keys ---


def test_one_parser_for_core_and_gpu_lists():
    assert parse_indices("3,0-1,1") == [3, 0, 1, 1]  # order and repeats kept
    assert parse_cores("3,0-1,1") == [0, 1, 3]
    assert format_indices([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_indices([3, 2]) == "3,2" and format_indices([]) == ""


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner=gpu", "learner.gpus=0-x"], "learner.gpus='0-x'"),
        (["actor.gpus=3-1"], "actor.gpus='3-1'"),
        (
            ["actor.gpus_per_actor=2"],
            "config key 'actor.gpus_per_actor' was removed: each vLLM actor gets one GPU per "
            "tensor-parallel worker; set actor.tensor_parallel_size instead",
        ),
        (["learner.device=cpu", "learner.gpus=0-1"], "learner.device=cpu"),
        # one GPU for both (layout=gpu1)
        (["layout=gpu1", "learner.weight_transport=nccl"], "NCCL cannot join two ranks on one GPU"),
        (["layout=gpu1", "learner.gpu_memory_fraction=0.6"], "must leave room on the GPU (sum < 1"),
        (["learner.gpu_memory_fraction=0"], "learner.gpu_memory_fraction must be > 0 and <= 1"),
        (["learner.gpu_memory_fraction=1.5"], "gpu_memory_fraction must be > 0 and <= 1, got 1.5"),
    ],
)
def test_bad_gpu_keys_name_the_problem(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides)


def test_an_actor_gets_one_gpu_per_tensor_parallel_worker():
    """Derived, not a second key that had to match."""
    assert load_config([]).actor.gpus_per_actor == 1
    assert load_config(["actor.tensor_parallel_size=2"]).actor.gpus_per_actor == 2


# --- the layouts users have ---


@pytest.mark.parametrize(("n", "layout"), [(8, "node8"), (4, "node4"), (2, "node2")])
def test_each_layout_preset_places_learner_and_actors_on_its_node(n, layout):
    cfg = load_config([f"layout={layout}"])
    plan = place(request_for(cfg, ("learner", "actors"), tuple(str(i) for i in range(n))))
    half = n // 2
    assert plan.learner == tuple(str(i) for i in range(half))
    assert plan.actors == tuple((str(i),) for i in range(half, n))
    assert cfg.learner.device == "cuda" and cfg.actor.engine == "vllm"


def test_too_many_gpus_asked_proposes_the_layout_that_fits():
    node8 = load_config(["learner=gpu", "actor=gpu"])  # 8 learner ranks + 1 actor: 9 GPUs
    message = _refused(request_for(node8, ("learner", "actors"), EIGHT), "this node has 8")
    assert message.endswith("or for a layout that fits all 8: layout=node8")
    four = tuple(str(i) for i in range(4))
    message = _refused(request_for(load_config(["layout=node8"]), ("learner", "actors"), four),
                       "this node has 4")  # fmt: skip
    assert "layout=node4" in message
    six = tuple(str(i) for i in range(6))
    assert "learner.nproc=3 actor.num_actors=3" in _refused(
        request_for(node8, ("learner", "actors"), six), "this node has 6"
    )
    one = _refused(request_for(load_config(["layout=node2"]), ("learner", "actors"), ("0",)),
                   "this node has 1")  # fmt: skip
    assert one.endswith("or for the learner and one vLLM actor sharing the GPU: layout=gpu1")


# --- one GPU for both ---


def test_layout_gpu1_puts_the_learner_and_the_actor_on_the_one_gpu():
    cfg = load_config(["layout=gpu1"])
    plan = place(request_for(cfg, ("learner", "actors"), ("0",)))
    assert plan.learner == ("0",) and plan.actors == (("0",),)
    assert plan.describe([0]) == "placement: learner rank 0 on GPU 0; actor 0 on GPU 0"
    assert cfg.learner.share_gpu and cfg.learner.gpu_memory_fraction == 0.45
    assert cfg.actor.gpu_memory_utilization == 0.45


def test_sharing_is_only_accepted_when_asked_for():
    both = ["learner=gpu", "actor=gpu", "learner.nproc=1", "learner.gpus=0", "actor.gpus=0"]
    _refused(request_for(load_config(both), ("learner", "actors"), EIGHT), "share GPU(s) 0")
    shared = both + ["learner.share_gpu=true", "learner.gpu_memory_fraction=0.4",
                     "actor.gpu_memory_utilization=0.4"]  # fmt: skip
    plan = place(request_for(load_config(shared), ("learner", "actors"), EIGHT))
    assert plan.learner == ("0",) and plan.actors == (("0",),)


def test_shared_actors_go_round_the_learners_gpus():
    cfg = load_config(["layout=gpu1", "learner.nproc=2", "actor.num_actors=3",
                       "learner.gpu_memory_fraction=0.3", "actor.gpu_memory_utilization=0.2"])  # fmt: skip
    plan = place(request_for(cfg, ("learner", "actors"), ("0", "1")))
    assert plan.learner == ("0", "1") and plan.actors == (("0",), ("1",), ("0",))


def test_a_learner_launched_alone_never_shares():
    """``learner.share_gpu`` is for ``asyncrl run``, which places both roles on one node."""
    req = request_for(load_config(["layout=gpu1"]), ("learner",), ("0",))
    assert not req.share and place(req).learner == ("0",)
