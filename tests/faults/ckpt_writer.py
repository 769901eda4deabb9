"""Checkpoint writer for tests/faults/test_checkpoint_kills.py (one process per rank).

    python tests/faults/ckpt_writer.py RUN_DIR MODEL_DIR MAX_VERSION        # 1 rank
    torchrun --nproc_per_node=2 tests/faults/ckpt_writer.py RUN_DIR MODEL_DIR MAX_VERSION
    python tests/faults/ckpt_writer.py --zygote                             # see zygote()

Resumes from ``latest_checkpoint`` (if any), checks that the loaded model and optimizer hash
to the digest that checkpoint's state.json recorded when it was saved, then trains and saves
one checkpoint per version until ``MAX_VERSION``, each with its state digest. Prints (rank 0)::

    VERIFIED <version> <digest>   or   FRESH        after resume
    SAVED <version> <digest>                        after save_checkpoint returned
    DONE                                            at MAX_VERSION

The test SIGKILLs it at random moments and at the checkpoint failpoints.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from asyncrl.learner.compute.model import build_policy, full_named_tensors  # noqa: E402
from asyncrl.learner.state.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: E402
from asyncrl.learner.trainer import init_distributed  # noqa: E402


def digest(model, optimizer) -> str:
    """sha256 of the full model and optimizer state (collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    h = hashlib.sha256()
    for name, t in full_named_tensors(model):
        h.update(name.encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    _, osd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    for fqn in sorted(osd["state"]):
        for key in sorted(osd["state"][fqn]):
            t = torch.as_tensor(osd["state"][fqn][key])
            t = t.full_tensor() if hasattr(t, "full_tensor") else t
            h.update(f"{fqn}.{key}".encode())
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def train_step(model, optimizer, version: int) -> None:
    """One real AdamW step on a fixed batch that depends on ``version``."""
    g = torch.Generator().manual_seed(version)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 8), generator=g)
    loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main(run_dir: str, model_dir: str, max_version: int) -> int:
    rank, _ = init_distributed()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_policy(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    say = print if rank == 0 else (lambda *a, **k: None)
    path = latest_checkpoint(run_dir)
    version = 0
    if path is None:
        say("FRESH", flush=True)
    else:
        saved = load_checkpoint(path, model, optimizer)
        got = digest(model, optimizer)
        if got != saved["digest"]:
            say(f"MISMATCH {saved['version']} loaded {got} saved {saved['digest']}", flush=True)
            return 3
        version = saved["version"]
        say(f"VERIFIED {version} {got}", flush=True)
    while version < max_version:
        train_step(model, optimizer, version)
        version += 1
        d = digest(model, optimizer)
        save_checkpoint(run_dir, version, model, optimizer, {"version": version, "digest": d},
                        model_dir)  # fmt: skip
        say(f"SAVED {version} {d}", flush=True)
    say("DONE", flush=True)
    return 0


def zygote() -> None:
    """Import torch once, then fork one 1-rank writer per stdin line (imports take 10-20 s
    on a loaded 2-core machine; a fork takes milliseconds).

    stdin:  ``RUN <run_dir> <model_dir> <max_version> <log_file> <failpoints or ->``
    stdout: ``PID <pid>`` when the writer starts, ``EXIT <returncode>`` when it ends
            (``-9`` = killed by SIGKILL). The writer's own lines go to ``log_file``.
    No torch op runs here before a fork, so no thread pool is inherited."""
    import os

    for line in sys.stdin:
        _, run_dir, model_dir, max_version, log_file, fps = line.split()
        pid = os.fork()
        if pid == 0:
            _child(run_dir, model_dir, int(max_version), log_file, fps)
        print(f"PID {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"EXIT {os.waitstatus_to_exitcode(status)}", flush=True)


def _child(run_dir: str, model_dir: str, max_version: int, log_file: str, fps: str) -> None:
    """A forked writer: arm its failpoints, run main(), never return into the zygote."""
    import os

    from asyncrl.core.runtime import faults

    os.environ[faults.ENV] = "" if fps == "-" else fps
    faults.reset()
    rc = 1
    try:
        sys.stdout = open(log_file, "w", buffering=1)  # noqa: SIM115 (closed by _exit)
        rc = main(run_dir, model_dir, max_version)
    except BaseException as e:  # report, then exit without running the zygote's code
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
    finally:
        sys.stdout.flush()
        os._exit(rc)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote()
    else:
        sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
