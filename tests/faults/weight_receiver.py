"""A weight receiver for tests/faults/test_weight_sync_faults.py: what an actor does on the
control plane, with a dict of tensors in place of the vLLM model.

    python tests/faults/weight_receiver.py CONTROL_ADDR ACTOR_ID OUT_DIR

register -> on ``weights_init``: join the group through the transport it names (``asyncrl.core.weights.transports``);
on ``update v``: receive every bucket into the model (failpoint
``receiver.bucket`` fires before each bucket is loaded: the test SIGKILLs a receiver
mid-transfer with ``ASYNCRL_FAILPOINTS=receiver.bucket=kill@N``), then write
``OUT_DIR/actor<ID>.json`` = {version, digest} and answer ``updated``; a failed receive
leaves the model marked invalid and waits for the next ``weights_init``; ``ping`` -> ``pong``;
``stop`` -> exit 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from asyncrl.core.net.control import ControlClient, Endpoint  # noqa: E402
from asyncrl.core.runtime.faults import failpoint  # noqa: E402
from asyncrl.core.weights import transports
from asyncrl.core.weights.stream import WeightSyncError  # noqa: E402


def digest(model: dict) -> str:
    """sha256 over the model's tensors in name order (same as the test's)."""
    h = hashlib.sha256()
    for name in sorted(model):
        h.update(name.encode())
        h.update(model[name].contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


async def run(meta: str, actor_id: int, out: Path) -> int:
    client = ControlClient(Endpoint.from_meta(json.loads(meta)), actor_id)
    await client.send({"type": "register"})
    print(f"REGISTERED {actor_id}", flush=True)
    receiver = None
    model: dict = {}
    while True:
        msg = await client.recv(0.5)
        if msg is None:
            continue
        kind = msg["type"]
        if kind == "weights_init":
            if receiver is not None:
                receiver.close()
            info = msg
            receiver = transports.receiver(info["transport"])
            await asyncio.to_thread(receiver.join, info, info["rank_offset"])
            print(f"JOINED rank {info['rank_offset']}/{info['world_size']}", flush=True)
        elif kind == "update":
            version = int(msg["version"])

            def load(tensors, v=version):
                failpoint("receiver.bucket", version=v)
                for name, t in tensors:
                    model[name] = t.clone()

            try:
                await asyncio.to_thread(receiver.receive, version, load)
            except WeightSyncError as e:
                print(f"FAILED {version}: {e}", flush=True)
                continue  # weights invalid until a rebuilt group syncs again
            d = digest(model)
            tmp = out / f".actor{actor_id}.json"  # atomic: the test polls this file
            tmp.write_text(json.dumps({"version": version, "digest": d}))
            tmp.replace(out / f"actor{actor_id}.json")
            await client.send({"type": "updated", "version": version, "digest": d})
            print(f"UPDATED {version} {d}", flush=True)
        elif kind == "ping":
            await client.send({"type": "pong", "nonce": msg.get("nonce")})
        elif kind == "stop":
            client.close()
            return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(run(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))))
