"""``asyncrl k8s render``: every object is valid against the Kubernetes API schema (strict:
an unknown field fails), and the objects mean what docs/multinode.md says: indices, the
rendezvous name, the Secret references, no password on any command line, the same config on
every role. No cluster runs here; the pods are simulated as far as Kubernetes' expansion of
``$(VAR)`` and asyncrl's config composition go."""

from __future__ import annotations

import copy
import stat
from urllib.parse import urlsplit

import pytest
import yaml

from asyncrl.buffer.service.files import ROLE_USERS
from asyncrl.core.config.load import load_config
from asyncrl.orchestration import cli
from asyncrl.orchestration.kubernetes.args import expand
from asyncrl.orchestration.kubernetes.options import KubeOptions
from asyncrl.orchestration.kubernetes.render import render, write

kv = pytest.importorskip(
    "kubernetes_validate",
    reason="the schema check needs kubernetes-validate: pip install -e '.[dev]'",
)
K8S_VERSION = "1.33"  # the schema the objects are checked against (pinned)
OVERRIDES = [
    "learner.nnodes=2",
    "learner.nproc=2",
    "actor.nnodes=3",
    "actor.num_actors=2",
    "buffer.name=team1",
    "experiment_name='cost$(x)'",
]
OPTIONS = KubeOptions(
    image="registry.example/asyncrl:1",
    namespace="rl",
    name="job1",
    storage_class="nfs",
    learner_gpus=2,
    actor_gpus=2,
)
SECRET = {"actor": "actor-secret-0123456789", "learner": "learner-secret-0123456789"}


@pytest.fixture(scope="module")
def rendering():
    return render(OVERRIDES, OPTIONS)


def one(rendering, kind: str, name: str) -> dict:
    (found,) = [
        m for m in rendering.manifests if (m["kind"], m["metadata"]["name"]) == (kind, name)
    ]
    return found


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def arg(container: dict, key: str) -> str:
    (value,) = [a.partition("=")[2] for a in container["args"] if a.partition("=")[0] == key]
    return value


def pod_env(container: dict, pod_ip: str, index: int | None) -> dict[str, str]:
    """The container's environment as Kubernetes builds it: the Secret's keys, the pod's IP,
    the completion index the Job controller adds, and ``$(VAR)`` expanded in order."""
    env = {"JOB_COMPLETION_INDEX": str(index)} if index is not None else {}
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "secretKeyRef" in source:
            assert source["secretKeyRef"]["name"] == "job1-redis"
            env[var["name"]] = SECRET[source["secretKeyRef"]["key"]]
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "status.podIP"
            env[var["name"]] = pod_ip
        else:
            env[var["name"]] = expand(var["value"], env)
    return env


def pod_config(container: dict, index: int | None, monkeypatch):
    """The config ``asyncrl launch ROLE`` composes in that pod: its args expanded by
    Kubernetes, ``${oc.env:..}`` resolved by asyncrl from the pod's environment."""
    env = pod_env(container, f"10.1.0.{(index or 0) + 10}", index)
    args = [expand(a, env) for a in container["args"]]
    assert args[0] == "launch"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return args, load_config(args[2:])


# -- the schema ---------------------------------------------------------------------------------


def test_every_object_is_valid_against_the_kubernetes_api_schema(rendering):
    kinds = sorted(m["kind"] for m in rendering.manifests)
    assert kinds == ["Job", "Job", "NetworkPolicy", "PersistentVolumeClaim", "Service",
                     "Service", "StatefulSet"]  # fmt: skip
    for manifest in rendering.manifests:
        kv.validate(manifest, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_object(rendering):
    """The check above can fail: strict mode refuses an unknown field, a wrong type and a
    missing required field."""
    job = one(rendering, "Job", "job1-learner")
    unknown = copy.deepcopy(job)
    pod_spec(unknown)["containers"][0]["gpus"] = 2  # not a Container field
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["completions"] = "two"
    missing = copy.deepcopy(job)
    del pod_spec(missing)["containers"][0]["name"]
    misplaced = copy.deepcopy(one(rendering, "StatefulSet", "job1-buffer"))
    misplaced["spec"]["template"]["spec"]["subdomian"] = "x"  # a typo
    for broken in (unknown, wrong_type, missing, misplaced):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, K8S_VERSION, strict=True)


def test_the_files_hold_the_objects_and_no_secret(rendering, tmp_path):
    paths = write(rendering, tmp_path / "out")
    assert [p.name for p in paths] == ["shared.yaml", "buffer.yaml", "learner.yaml", "actors.yaml"]
    back = []
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        text = path.read_text()
        assert "&id" not in text and "*id" not in text  # no YAML anchors
        back += list(yaml.safe_load_all(text))
    assert back == rendering.manifests
    assert "Secret" not in {m["kind"] for m in back}  # the user makes it; no password here


# -- what the objects mean ----------------------------------------------------------------------


def test_every_object_is_in_the_namespace_and_every_pod_in_the_network_policy(rendering):
    policy = one(rendering, "NetworkPolicy", "job1")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    for m in rendering.manifests:
        assert m["metadata"]["namespace"] == "rl"
        if m["kind"] in ("Job", "StatefulSet"):
            pod_labels = m["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= pod_labels.items(), m["metadata"]["name"]


def test_the_learner_is_an_indexed_job_whose_pod_0_is_the_rendezvous(rendering):
    job, service = one(rendering, "Job", "job1-learner"), one(rendering, "Service", "job1-learner")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 2  # learner.nnodes
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert pod_spec(job)["subdomain"] == service["metadata"]["name"]
    assert (
        service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    container = pod_spec(job)["containers"][0]
    host, _, port = arg(container, "learner.rdzv_endpoint").rpartition(":")
    # an indexed Job's pod i is named <job>-i; its FQDN under the headless Service:
    assert host == "job1-learner-0.job1-learner.rl.svc.cluster.local"
    assert int(port) == service["spec"]["ports"][0]["port"]
    assert arg(container, "learner.node_rank") == "$(JOB_COMPLETION_INDEX)"
    assert arg(container, "network.bind") == "$(ASYNCRL_POD_IP)"


def test_each_learner_pod_composes_its_own_rank_and_node_0s_endpoint(rendering, monkeypatch):
    container = pod_spec(one(rendering, "Job", "job1-learner"))["containers"][0]
    for index in (0, 1):
        _, cfg = pod_config(container, index, monkeypatch)
        assert cfg.learner.node_rank == index and cfg.learner.nnodes == 2
        assert cfg.network.bind == f"10.1.0.{index + 10}"
        assert cfg.run_dir == f"/shared/job1/learner-{index}"
        assert cfg.learner.checkpoint_dir == "/shared/job1/checkpoints"  # one, shared
        assert cfg.learner.rdzv_endpoint.startswith("job1-learner-0.job1-learner.rl.svc.")


def test_the_actors_are_an_indexed_job_with_a_run_directory_per_index(rendering, monkeypatch):
    job = one(rendering, "Job", "job1-actors")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3  # actor.nnodes
    assert pod_spec(job)["restartPolicy"] == "OnFailure"  # same pod, same run_dir, same ids
    container = pod_spec(job)["containers"][0]
    dirs = {pod_config(container, i, monkeypatch)[1].run_dir for i in range(3)}
    assert dirs == {"/shared/job1/actors-0", "/shared/job1/actors-1", "/shared/job1/actors-2"}


def test_the_buffer_is_a_stateful_set_with_its_aof_on_a_claim_and_passwords_from_the_secret(
    rendering,
):
    sts, service = (
        one(rendering, "StatefulSet", "job1-buffer"),
        one(rendering, "Service", "job1-buffer"),
    )
    spec = sts["spec"]
    assert spec["replicas"] == 1 and spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"]
    container = pod_spec(sts)["containers"][0]
    assert container["args"][:2] == ["launch", "buffer"]
    (port,) = service["spec"]["ports"]
    assert {"name": port["targetPort"], "containerPort": port["port"]} in container["ports"]
    assert arg(container, "buffer.port") == str(port["port"])
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["storageClassName"] == "nfs"
    assert arg(container, "run_dir").startswith(mounts[claim["metadata"]["name"]] + "/")
    (secret,) = pod_spec(sts)["volumes"]
    assert secret["secret"] == {"secretName": "job1-redis", "defaultMode": 0o400}
    assert arg(container, "buffer.passwords_dir") == mounts[secret["name"]]
    assert "resources" not in container  # no GPU for Redis


def test_the_roles_get_their_own_users_url_in_the_environment_never_on_argv(rendering, monkeypatch):
    for name, user in (("job1-learner", "learner"), ("job1-actors", "actor")):
        container = pod_spec(one(rendering, "Job", name))["containers"][0]
        env = pod_env(container, "10.1.0.9", 0)
        url = urlsplit(env["ASYNCRL_BUFFER_URL"])
        assert (url.username, url.password) == (user, SECRET[user])
        assert (url.hostname, url.port) == ("job1-buffer.rl.svc.cluster.local", 6379)
        args, cfg = pod_config(container, 0, monkeypatch)
        assert cfg.buffer.url == env["ASYNCRL_BUFFER_URL"]
        assert cli.secret_in_argv(args[2:], cfg) == ""  # the launch's own check passes
        assert not any(pw in a for pw in SECRET.values() for a in args)
    for m in rendering.manifests:  # no password, and no URL with credentials, in any command
        if m["kind"] in ("Job", "StatefulSet"):
            spec = pod_spec(m)
            for c in spec["containers"] + spec.get("initContainers", []):
                words = c["command"] + c.get("args", [])
                assert not any("@" in w or "PASSWORD" in w for w in words), c["name"]
                refs = [
                    v["valueFrom"]["secretKeyRef"]
                    for v in c["env"]
                    if "secretKeyRef" in v.get("valueFrom", {})
                ]
                assert all(r["name"] == "job1-redis" and r["key"] in ROLE_USERS for r in refs)


def test_every_role_composes_the_same_job(rendering, monkeypatch):
    containers = [
        pod_spec(one(rendering, kind, name))["containers"][0]
        for kind, name in (
            ("StatefulSet", "job1-buffer"),
            ("Job", "job1-learner"),
            ("Job", "job1-actors"),
        )
    ]
    configs = [pod_config(c, 0, monkeypatch)[1] for c in containers]
    same = {
        (
            c.buffer.name,
            c.actor.num_actors,
            c.actor.nnodes,
            c.learner.nnodes,
            c.learner.rdzv_endpoint,
            c.learner.checkpoint_dir,
            c.experiment_name,
        )
        for c in configs
    }
    assert len(same) == 1, same
    assert next(iter(same))[:4] == ("team1", 2, 3, 2)
    assert configs[0].experiment_name == "cost$(x)"  # a user's $ survives Kubernetes


def test_gpus_and_volumes_are_asked_per_role(rendering):
    claim = one(rendering, "PersistentVolumeClaim", "job1-shared")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in ("job1-learner", "job1-actors"):
        spec = pod_spec(one(rendering, "Job", name))
        (container,) = spec["containers"]
        assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "job1-shared"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert arg(container, "run_dir").startswith(mounts["shared"] + "/")
        assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
        (init,) = spec["initContainers"]
        assert init["name"] == "wait-for-buffer"


def test_without_gpus_or_with_an_existing_claim(monkeypatch):
    options = KubeOptions(image="img:1", shared_claim="models", env_secrets=("hf",))
    rendered = render([], options)
    assert "PersistentVolumeClaim" not in {m["kind"] for m in rendered.manifests}
    for m in rendered.manifests:
        kv.validate(m, K8S_VERSION, strict=True)
        if m["kind"] == "Job":
            (container,) = pod_spec(m)["containers"]
            assert "resources" not in container
            assert container["envFrom"] == [{"secretRef": {"name": "hf"}}]
            assert pod_spec(m)["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"


def test_the_command_writes_the_files_and_says_what_to_apply(tmp_path, capsys):
    out = tmp_path / "k8s"
    code = cli.main(
        [
            "k8s",
            "render",
            "--image",
            "img:1",
            "--out",
            str(out),
            "--name",
            "j",
            "actor.num_actors=2",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "actors.yaml",
        "buffer.yaml",
        "learner.yaml",
        "shared.yaml",
    ]
    assert f"wrote {out / 'learner.yaml'}: Service j-learner, Job j-learner" in printed
    assert "kubectl -n default create secret generic j-redis --from-file=actor=<(" in printed
    assert f"kubectl -n default apply -f {out}" in printed
    assert "/shared/j/learner-0/summary.json" in printed


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)-$(B)", "1-$(B)"),  # an undefined variable stays as written
        ("$$(A)", "$(A)"),
        ("$${oc.env:X}", "${oc.env:X}"),
        ("a$b$", "a$b$"),
        ("$(A", "$(A"),
    ],
)
def test_the_expansion_is_kubernetes(text, expanded):
    assert expand(text, {"A": "1"}) == expanded
