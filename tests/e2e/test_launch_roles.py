"""`asyncrl launch buffer|learner|actors` as separate commands against one Redis URL: they
train together; a role that dies fails the waiting test at once; a waiting learner says what
it waits for and stops promptly on SIGTERM."""

import signal
import time

import psutil
import pytest

from asyncrl.orchestration.launch.launcher import process_tree
from tests.e2e.conftest import needs_full_stack, read_summary
from tests.roles import RoleDied, cmdline

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.mark.vllm
def test_three_roles_train_together(tmp_path, roles):
    needs_full_stack()
    buffer = roles.cli("buffer", "launch", "buffer", f"run_dir={tmp_path / 'buffer'}")
    url_file = tmp_path / "buffer" / "redis" / "redis.url"
    url = roles.wait_until(lambda: url_file.is_file() and url_file.read_text().strip(), 300,
                           "the buffer's URL file")  # fmt: skip
    common = ["experiment=tiny", f"buffer.url={url}", "buffer.name=launchtest"]
    actors = roles.cli("actors", "launch", "actors", *common, f"run_dir={tmp_path / 'actors'}",
                       may_exit=True)  # fmt: skip
    learner = roles.cli("learner", "launch", "learner", *common, f"run_dir={tmp_path / 'learner'}")
    assert roles.wait(learner, 900) == 0, learner.tail(80)
    assert roles.wait(actors, 120) == 0, actors.tail(80)
    summary = read_summary(tmp_path / "learner")
    assert summary["final_version"] == 4
    assert summary["groups_trained"] == 16
    assert "committed" in actors.output()  # the actor's closing line
    assert roles.signal(buffer, signal.SIGINT, 30) == 0, buffer.tail()


@pytest.mark.timeout(300)
def test_roles_train_over_tls_with_their_url_files(tmp_path, roles):
    """``launch buffer buffer.tls_dir=DIR``: the certificate is made, Redis serves TLS only,
    and the learner and the actors, each given its ACL user's URL file, train over it."""
    tls, bdir = tmp_path / "tls", tmp_path / "buffer"
    buffer = roles.cli("buffer", "launch", "buffer", f"run_dir={bdir}", f"buffer.tls_dir={tls}",
                       "metrics_port=0", "buffer.name=tlstest")  # fmt: skip
    roles.wait_until(lambda: "TLS only" in buffer.output(), 60, "the buffer's TLS line")
    assert (bdir / "redis" / "redis.actor.url").read_text().startswith("rediss://actor:")
    common = ["experiment=tiny", "actor.engine=sim", "actor.sim_tokens_per_s=500",
              "learner.steps=3", "metrics_port=0", "buffer.name=tlstest"]  # fmt: skip
    actors = roles.cli("actors", "launch", "actors", *common, f"run_dir={tmp_path / 'actors'}",
                       f"buffer.url_file={bdir / 'redis' / 'redis.actor.url'}",
                       may_exit=True)  # fmt: skip
    learner = roles.cli("learner", "launch", "learner", *common, f"run_dir={tmp_path / 'l'}",
                        f"buffer.url_file={bdir / 'redis' / 'redis.learner.url'}")  # fmt: skip
    assert roles.wait(learner, 240) == 0, learner.tail(80)
    assert roles.wait(actors, 60) == 0, actors.tail(80)
    assert read_summary(tmp_path / "l")["final_version"] == 3
    assert "tls-port" in (bdir / "redis" / "redis.conf").read_text()
    assert roles.signal(buffer, signal.SIGINT, 30) == 0, buffer.tail()


def _learner(roles, tmp_path, url: str, name: str):
    """``asyncrl launch learner`` (simulated-engine preset, no metrics) against ``url``."""
    return roles.cli("learner", "launch", "learner", "experiment=tiny", "actor.engine=sim",
                     f"buffer.url={url}", f"buffer.name={name}", "metrics_port=0",
                     f"run_dir={tmp_path / 'learner'}")  # fmt: skip


@pytest.mark.timeout(300)
def test_an_actor_that_dies_at_start_fails_the_waiting_test_within_60s(
    tmp_path, roles, redis_server
):
    """The test waits on the learner, which waits for an actor that died at start: the wait
    fails within seconds of the death (not at the learner's 600 s deadline), and the failure
    message carries the actor's error."""
    learner = _learner(roles, tmp_path, redis_server.url, "diesatstart")
    roles.wait_line(learner, "waiting for 1 actor(s) to register", 240)
    actors = roles.cli("actors", "launch", "actors", "experiment=tiny", "actor.engine=sim",
                       f"buffer.url={redis_server.url}", "buffer.name=diesatstart",
                       "metrics_port=0", f"run_dir={tmp_path / 'actors'}",
                       env={"ASYNCRL_FAILPOINTS": "actor.start=raise"})  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(RoleDied) as died:
        roles.wait(learner, 600)
    waited = time.monotonic() - t0
    message = str(died.value)
    assert waited < 60, f"the wait took {waited:.0f}s after the actor's start"
    assert "'actors'" in message and "exited with code 1" in message, message
    assert "FailpointError" in message and "actor.start" in message, message  # the actor's error
    assert actors.poll() == 1
    print(f"\nthe actor died at start; the waiting test failed {waited:.1f}s after starting it")


@pytest.mark.timeout(300)
def test_a_waiting_learner_reports_its_wait_and_stops_promptly_on_sigterm(
    tmp_path, roles, redis_server
):
    """`asyncrl launch learner` with no actor: it says what it waits for, how long it has
    waited and its deadline (every 15 s); SIGTERM ends it and its torchrun ranks in seconds."""
    learner = _learner(roles, tmp_path, redis_server.url, "waitstop")
    first = roles.wait_line(learner, "waiting for 1 actor(s) to register", 240)
    assert "giving up after 600s" in first, first
    still = roles.wait_line(learner, "still waiting for 1 actor(s)", 40)
    assert "(0/1 registered: [])" in still and "s of 600s" in still, still
    took = _sigterm_stops_the_tree(roles, learner, "asyncrl.learner.main")
    out = learner.output()
    assert "stopped on request while waiting for 1 actor(s)" in out, learner.tail()
    # the ranks leave together, and torchrun with one line (no rank or agent traceback)
    assert "no step was trained: a stop request" in out, learner.tail()
    assert "Traceback" not in out and "Traceback" not in _run_log(tmp_path), learner.tail()
    print(f"\nSIGTERM stopped the waiting learner launcher and its ranks in {took:.1f}s")


@pytest.mark.timeout(300)
def test_a_second_learner_on_a_buffer_is_refused_naming_the_first(tmp_path, roles, redis_server):
    """Formerly, a second `launch learner` on a buffer (another run_dir) took the first one's
    pending groups and reset its version. Now it is refused at once, naming the holder, and
    the first learner goes on waiting."""
    first = _learner(roles, tmp_path, redis_server.url, "twolearners")
    roles.wait_line(first, "waiting for 1 actor(s) to register", 240)
    second = roles.cli("learner2", "launch", "learner", "experiment=tiny", "actor.engine=sim",
                       f"buffer.url={redis_server.url}", "buffer.name=twolearners",
                       "metrics_port=0", f"run_dir={tmp_path / 'other'}", may_exit=True)  # fmt: skip
    assert roles.wait(second, 240) != 0, second.tail()
    out = second.output()
    assert "buffer 'twolearners' already has a learner: pid" in out, second.tail()
    assert f"run_dir {(tmp_path / 'learner').resolve()}" in out, second.tail()
    assert first.poll() is None, first.tail()  # the first one is untouched
    assert roles.signal(first, signal.SIGTERM, 60) == 130, first.tail()


def _run_log(tmp_path) -> str:
    """The learner role's own log (what the ranks and torchrun printed)."""
    return next((tmp_path / "learner").rglob("learner.log")).read_text(errors="replace")


def _sigterm_stops_the_tree(roles, launcher, child: str) -> float:
    """SIGTERM a launcher whose ``child`` role is up: it exits 130 within 8 s and leaves no
    process of its tree behind. Returns the seconds it took."""
    tree = process_tree(launcher.pid)
    assert any(child in cmdline(p) for p in tree[1:]), f"no {child} process: {tree}"
    t0 = time.monotonic()
    code = roles.signal(launcher, signal.SIGTERM, 60)
    took = time.monotonic() - t0
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert took < 8, f"SIGTERM took {took:.1f}s to stop {launcher.name}:\n{launcher.tail()}"
    assert not left, f"still running after the launcher exited: {left}"
    assert code == 130, launcher.tail()
    return took


@pytest.mark.timeout(300)
def test_a_waiting_actor_reports_its_wait_and_stops_promptly_on_sigterm(
    tmp_path, roles, redis_server
):
    """`asyncrl launch actors` with no learner: the actor says it waits for a learner, how
    long it has waited and its deadline; SIGTERM ends the launcher and the actor in seconds."""
    actors = roles.cli("actors", "launch", "actors", "experiment=tiny", "actor.engine=sim",
                       f"buffer.url={redis_server.url}", "buffer.name=actorwait",
                       "metrics_port=0", f"run_dir={tmp_path / 'actors'}")  # fmt: skip
    first = roles.wait_line(actors, "[actor 0] waiting for a learner to announce itself", 240)
    assert "in buffer 'actorwait'; giving up after 900s" in first, first
    still = roles.wait_line(actors, "[actor 0] still waiting for a learner", 40)
    assert "s of 900s" in still, still
    took = _sigterm_stops_the_tree(roles, actors, "asyncrl.actors.main")
    assert "stopped on request while waiting for a learner" in actors.output(), actors.tail()
    print(f"\nSIGTERM stopped the waiting actors launcher and its actor in {took:.1f}s")
