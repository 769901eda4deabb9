"""Static checks of the seams, run by mypy (pyproject.toml ``[tool.mypy] files``: ``make lint``,
the pre-commit hook) and by tests/unit/learner/test_null_hub.py and
tests/unit/buffer/test_faces.py; never executed. Each implementation is assigned to a name of
its protocol's type, so a method missing on one, or a signature that drifted from the
protocol's, is a type error here:

    LearnerHub     <- Hub (rank 0), NullHub (the other ranks)    asyncrl/learner/hub/protocol.py
    ActorBuffer    <- ReplayBuffer                                asyncrl/buffer/faces.py
    LearnerBuffer  <- ReplayBuffer
"""

from __future__ import annotations

from asyncrl.buffer.faces import ActorBuffer, LearnerBuffer
from asyncrl.buffer.redis_buffer import ReplayBuffer
from asyncrl.learner.hub.hub import Hub
from asyncrl.learner.hub.null import NullHub
from asyncrl.learner.hub.protocol import LearnerHub


def hubs(hub: Hub, null: NullHub) -> tuple[LearnerHub, LearnerHub]:
    """Rank 0's hub and the other ranks' are both what the loop holds."""
    rank0: LearnerHub = hub
    others: LearnerHub = null
    return rank0, others


def buffer_faces(buffer: ReplayBuffer) -> tuple[ActorBuffer, LearnerBuffer]:
    """One ``ReplayBuffer`` shows each role its face."""
    actor: ActorBuffer = buffer
    learner: LearnerBuffer = buffer
    return actor, learner
