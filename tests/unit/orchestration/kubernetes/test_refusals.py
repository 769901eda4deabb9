"""What ``asyncrl k8s render`` refuses, each with the option or key named and the fix, before
anything is written."""

from __future__ import annotations

import re

import pytest

from asyncrl.orchestration import cli
from asyncrl.orchestration.kubernetes.options import KubeError, KubeOptions
from asyncrl.orchestration.kubernetes.render import render

IMAGE = "img:1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(image=""), "--image is required: the container image with asyncrl installed"),
        (dict(image="  "), "--image is required"),
        (dict(name="Job_1"), "--name 'Job_1': give at most 40 lower-case letters"),
        (dict(name="1job"), "--name '1job'"),
        (dict(name="j" * 41), "at most 40"),
        (dict(namespace="Team"), "--namespace 'Team' is not a namespace name"),
        (dict(shared_size="lots"), "--shared-size 'lots' is not a Kubernetes quantity"),
        (dict(buffer_size="10GB"), "--buffer-size '10GB' is not a Kubernetes quantity"),
        (dict(learner_gpus=-1), "--learner-gpus -1: give 0 (no GPU) or more"),
        (dict(storage_class="Fast SSD"), "--storage-class 'Fast SSD' is not a Kubernetes object"),
        (dict(env_secrets=("HF TOKEN",)), "--env-secret 'HF TOKEN' is not a Secret name"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(KubeError, match=re.escape(message)):
        KubeOptions(**{"image": IMAGE, **options})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "learner.node_rank=1",
            "learner.node_rank is set by the Kubernetes manifests (each "
            "learner pod's completion index)",
        ),
        ("learner.rdzv_endpoint=h:1", "learner.rdzv_endpoint is set by the Kubernetes manifests"),
        (
            "network.bind=10.0.0.1",
            "network.bind is set by the Kubernetes manifests (each pod binds its own IP",
        ),
        ("buffer.url=redis://:pw@h:1/0", "buffer.url is set by the Kubernetes manifests"),
        ("buffer.url_file=/x", "buffer.url_file is set"),
        ("+run_dir=/x", "run_dir is set"),
        ("learner.checkpoint_dir=/x", "learner.checkpoint_dir is set"),
        (
            "buffer=remote",
            "buffer is set by the Kubernetes manifests (the manifests run the job's own Redis",
        ),
        (
            "buffer.tls_dir=/tls",
            "buffer.tls_dir is set by the Kubernetes manifests (not "
            "supported by these manifests yet",
        ),
    ],
    ids=lambda v: v.partition("=")[0] if "=" in v else None,
)
def test_a_key_the_manifests_own_is_refused(override, message):
    with pytest.raises(KubeError, match=re.escape(message)):
        render([override], KubeOptions(image=IMAGE))


def test_a_config_a_pod_would_refuse_is_refused_here_naming_the_pods():
    with pytest.raises(KubeError, match=r"^the learner pods' config: .*actor.nnodes must be >= 1"):
        render(["actor.nnodes=0"], KubeOptions(image=IMAGE))
    with pytest.raises(KubeError, match=r"the learner pods' config: .*learner.stepz"):
        render(["learner.stepz=3"], KubeOptions(image=IMAGE))


@pytest.mark.parametrize(
    ("overrides", "options", "message"),
    [
        (
            ["learner.nproc=4"],
            dict(learner_gpus=2),
            "--learner-gpus 2 is fewer than the "
            "learner.nproc=4 ranks each learner pod starts, one per GPU",
        ),
        (
            ["actor.num_actors=2", "actor.tensor_parallel_size=2"],
            dict(actor_gpus=3),
            "--actor-gpus 3 is fewer than each actor pod's actor.num_actors=2 x "
            "actor.tensor_parallel_size=2 = 4 GPUs: give --actor-gpus 4",
        ),
    ],
    ids=["learner", "actors"],
)
def test_fewer_gpus_than_a_pod_places_are_refused(overrides, options, message):
    with pytest.raises(KubeError, match=re.escape(message)):
        render(overrides, KubeOptions(image=IMAGE, **options))


def test_the_command_says_the_problem_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "k8s"
    assert cli.main(["k8s", "render", "--out", str(out)]) == 2
    assert "asyncrl: k8s: --image is required" in capsys.readouterr().err
    assert (
        cli.main(["k8s", "render", "--image", IMAGE, "--out", str(out), "learner.node_rank=1"]) == 2
    )
    assert "learner.node_rank is set by the Kubernetes manifests" in capsys.readouterr().err
    assert not out.exists()
