"""Read back what the experiment trackers wrote under a run directory, with each library's
own reader (W&B has no public reader of offline runs: ``wandb_records`` parses the file)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the event files in ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 = keep all
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def tensorboard_text(log_dir: Path, tag: str) -> str:
    """The first text summary of ``tag``."""
    return tensorboard_texts(log_dir, tag)[0][1]


def tensorboard_texts(log_dir: Path, tag: str) -> list[tuple[int, str]]:
    """``[(step, text), ...]`` of every text summary of ``tag`` in ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})  # 0 = keep all
    events.Reload()
    summaries = events.Tensors(f"{tag}/text_summary")
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in summaries]


def mlflow_client(store: Path):
    """An ``MlflowClient`` on the file store ``store`` (MLflow 3 opens one only with
    ``MLFLOW_ALLOW_FILE_STORE=true``, which this sets in os.environ)."""
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"file:{store}")


def mlflow_runs(store: Path) -> list:
    """Every run (``mlflow.entities.Run``) in the file store ``store``."""
    client = mlflow_client(store)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def mlflow_history(store: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    history = mlflow_client(store).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


def mlflow_json_artifacts(store: Path, run_id: str, folder: str) -> dict[str, object]:
    """``{artifact path: parsed JSON}`` of the files in ``folder`` of run ``run_id``."""
    import tempfile

    client = mlflow_client(store)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for info in client.list_artifacts(run_id, folder):
            local = client.download_artifacts(run_id, info.path, tmp)
            out[info.path] = json.loads(Path(local).read_text())
    return out


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: W&B's LevelDB-style log (a 7-byte file
    header ``:W&B`` + magic + version, then 32 KiB blocks of chunks, each with a 7-byte
    header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    pos, chunks, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def wandb_offline_run(wandb_dir: Path) -> dict:
    """The one offline run under ``wandb_dir``: ``project``, ``name``, ``history`` (one dict
    per ``log`` call), ``config``, ``summary`` and ``finished`` (it ended with an exit record)."""
    (path,) = wandb_dir.glob("offline-run-*/run-*.wandb")
    records = wandb_records(path)
    runs = [r.run for r in records if r.HasField("run")]
    kinds = [r.WhichOneof("record_type") for r in records]
    assert len(runs) == 1, f"{path} ({path.stat().st_size} bytes): records {kinds}"
    run = runs[0]
    out = {"project": run.project, "name": run.display_name, "history": [], "config": {},
           "summary": {}, "finished": records[-1].HasField("exit")}  # fmt: skip
    for r in records:
        if r.HasField("history"):
            out["history"].append(_items(r.history.item))
        elif r.HasField("config"):
            out["config"] |= _items(r.config.update)
        elif r.HasField("summary"):
            out["summary"] |= _items(r.summary.update)
    return out


def wandb_offline_runs(wandb_dir: Path) -> list[dict]:
    """Every offline run directory under ``wandb_dir``, oldest first (a resumed run writes
    another one with the same id): ``id``, ``steps`` (the ``_step`` of each ``log``) and
    ``exit_code`` (None if it did not finish)."""
    out = []
    for path in sorted(wandb_dir.glob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name):
        records = wandb_records(path)
        (run,) = [r.run for r in records if r.HasField("run")]
        exits = [r.exit.exit_code for r in records if r.HasField("exit")]
        steps = [_items(r.history.item)["_step"] for r in records if r.HasField("history")]
        out.append({"id": run.run_id, "steps": steps, "exit_code": exits[-1] if exits else None})
    return out


def wandb_tables(wandb_dir: Path, key: str) -> list[tuple[int, dict]]:
    """``[(step, {"columns": [...], "data": [[...], ...]}), ...]``: every ``wandb.Table``
    logged as ``key`` in the one offline run under ``wandb_dir``, read from the file its
    history row names (``<run>/files/media/table/...``)."""
    (run_dir,) = wandb_dir.glob("offline-run-*")
    rows = wandb_offline_run(wandb_dir)["history"]
    return [
        (h["_step"], json.loads((run_dir / "files" / h[f"{key}/path"]).read_text()))
        for h in rows
        if h.get(f"{key}/_type") == "table-file"
    ]


def _items(items) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
