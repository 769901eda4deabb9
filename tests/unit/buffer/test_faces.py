"""The buffer's two faces (asyncrl/buffer/faces.py): ``ReplayBuffer`` is an ``ActorBuffer`` and a
``LearnerBuffer`` (tests/unit/conformance.py), the actors and the learner's hub call nothing on
a buffer beyond their face, and the buffer's helpers nothing beyond ``BufferHandle``. Checked by
mypy on these files (``make lint`` checks the same with every type followed)."""

from __future__ import annotations

from tests.unit.typecheck import CONFORMANCE, mypy, rejected

SEAM = ["asyncrl/buffer/faces.py", "asyncrl/buffer/redis_buffer.py"]
USERS = [
    "asyncrl/buffer/cursors.py",
    "asyncrl/buffer/eval_queue.py",
    "asyncrl/actors/actor.py",
    "asyncrl/actors/claims.py",
    "asyncrl/actors/control_plane.py",
    "asyncrl/actors/main.py",
    "asyncrl/actors/data/identity.py",
    "asyncrl/learner/hub/hub.py",
    "asyncrl/learner/hub/feed.py",
    "asyncrl/learner/hub/data.py",
    "asyncrl/learner/hub/recorder.py",
    "asyncrl/learner/hub/validation.py",
]

CROSSED = """
from asyncrl.buffer.faces import ActorBuffer, LearnerBuffer


class ReadOnly:  # reads, never acks
    def read(self, consumer: str, count: int, block_ms: int, vocab_size: int | None = None) -> list:
        return []


def actor(buffer: ActorBuffer) -> None:
    buffer.read("learner", 1, 0)  # the learner's side


def learner(buffer: LearnerBuffer) -> None:
    buffer.lease(0, 1.0)  # the actors' side


fake: LearnerBuffer = ReadOnly()
"""


def test_replay_buffer_shows_each_role_its_face_and_the_roles_use_no_more(tmp_path):
    status, report = mypy([*SEAM, *USERS, CONFORMANCE], tmp_path / "cache")
    assert status == 0, report


def test_the_check_sees_a_role_reaching_across_and_a_fake_short_of_its_face(tmp_path):
    crossed = tmp_path / "crossed.py"
    crossed.write_text(CROSSED)
    errors, report = rejected([*SEAM, crossed], tmp_path / "cache")
    assert any('"ActorBuffer" has no attribute "read"' in e for e in errors), report
    assert any('"LearnerBuffer" has no attribute "lease"' in e for e in errors), report
    assert any('"ReadOnly", variable has type "LearnerBuffer"' in e for e in errors), report
    assert len(errors) == 3, report
