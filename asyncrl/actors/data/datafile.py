"""Read prompt datasets (parquet or JSON Lines) into rows, checking every key the config names.

``read_rows(files, keys)`` loads each file whole with pyarrow (``pyarrow.parquet`` for
``.parquet``/``.pq``, ``pyarrow.json`` for ``.jsonl``/``.json``/``.ndjson``) and returns one
``Row`` per record: the prompt (a string, or a list of chat messages ``{"role", "content"}``)
and the reward fields. A whole table per process is fine for RL prompt sets (thousands to a
few hundred thousand prompts); nothing here streams.

Reward fields of a row (``Prompt.fields``), by name:

- every column other than the prompt column, under its column name;
- ``ground_truth``: the value at ``data.answer_key``;
- ``data_source``: the value at ``data.data_source_key`` (only when that key is set);
- ``extra_info``: the value at ``data.extra_info_key`` (only when that key is set).

A key may be dotted into a struct column (verl's parquet keeps the answer at
``reward_model.ground_truth``); a column whose own name contains the dot wins. Every field must
be JSON-serialisable (fields may travel as JSON): a column of another type (bytes, dates,
decimals, ...) is refused with its name. Every problem raises ``DataError`` naming the config
key, the file and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.runtime.fatal import FatalError

RESERVED_FIELDS = ("ground_truth", "data_source", "extra_info")
"""Reward field names set from ``data.answer_key``, ``data_source_key``, ``extra_info_key``."""
_PARQUET = (".parquet", ".pq")
_JSONL = (".jsonl", ".json", ".ndjson")


class DataError(ValueError, FatalError):
    """A dataset cannot be used as configured; the message names the key and the fix.

    A ``ValueError`` (callers catch it as one) and a ``FatalError``: loading the same data
    again fails the same way, so an actor that raises it records it (asyncrl/core/runtime/fatal.py) and
    the launcher does not restart it."""


@dataclass(frozen=True)
class DataKeys:
    """Where each part of a record is (``data.*_key``); '' = not set."""

    prompt: str
    answer: str
    data_source: str = ""
    extra_info: str = ""
    files_key: str = "data.train_files"
    """The config key that named the files (for messages)."""


@dataclass(frozen=True)
class Row:
    """One record: ``where`` (``"row 3 of a.parquet"``), its prompt and its reward fields."""

    where: str
    prompt: str | list
    fields: dict
    columns: dict
    """The record's top-level columns (Jinja2 prompt templates see them by name)."""


def read_rows(files: list[str], keys: DataKeys) -> list[Row]:
    """Every record of ``files``, in file order; ``DataError`` on any unusable input."""
    if not files:
        raise DataError(f"{keys.files_key} is empty; give one or more .parquet or .jsonl files")
    rows: list[Row] = []
    for name in files:
        table = _read_table(Path(name).expanduser(), keys.files_key)
        rows.extend(_table_rows(table, name, keys))
    if not rows:
        which = "it has" if len(files) == 1 else f"each of the {len(files)} files has"
        raise DataError(
            f"{keys.files_key}: {which} 0 rows ({', '.join(map(repr, files))}); give files "
            "with at least one record"
        )
    return rows


def first_row(files: list[str], keys: DataKeys) -> Row:
    """The first record of ``files`` (reading file by file until one has rows);
    ``DataError`` as ``read_rows`` when none has."""
    for i, name in enumerate(files):
        table = _read_table(Path(name).expanduser(), keys.files_key)
        if table.num_rows:
            return _table_rows(table.slice(0, 1), name, keys)[0]
        if i == len(files) - 1:
            break
    return read_rows(files, keys)[0]  # raises, naming what is wrong


def _read_table(path: Path, key: str):
    if not path.is_file():
        raise DataError(
            f"{key}: {str(path)!r} does not exist (or is not a file); give the path of a "
            ".parquet or .jsonl file (relative paths are from the directory you run in)"
        )
    suffix = path.suffix.lower()
    try:
        if suffix in _PARQUET:
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if suffix in _JSONL:
            import pyarrow.json as pj

            return pj.read_json(path)
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... with the reason
        kind = "parquet" if suffix in _PARQUET else "JSON Lines (one JSON object per line)"
        why = _first_line(e)
        if suffix in _JSONL:  # pyarrow's "row N" counts from 0 within a block: find the line
            why = _bad_jsonl_line(path) or why
        raise DataError(
            f"{key}: {str(path)!r} cannot be read as {kind}: {why}; fix the file or convert it"
        ) from None
    raise DataError(
        f"{key}: {str(path)!r} has an unknown format {suffix or '(no suffix)'!r}; give "
        f"parquet ({', '.join(_PARQUET)}) or JSON Lines ({', '.join(_JSONL)}) files"
    )


def _table_rows(table, name: str, keys: DataKeys) -> list[Row]:
    columns = table.column_names
    wanted = {
        "data.prompt_key": keys.prompt,
        "data.answer_key": keys.answer,
        "data.data_source_key": keys.data_source,
        "data.extra_info_key": keys.extra_info,
    }
    for cfg_key, dotted in wanted.items():
        if dotted:
            _check_path(table.schema, dotted, cfg_key, name)
    pairs = zip(RESERVED_FIELDS, (keys.answer, keys.data_source, keys.extra_info), strict=True)
    targets = dict(pairs)
    for reserved, dotted in targets.items():
        if reserved in columns and dotted and dotted != reserved:
            raise DataError(
                f"{name}: column {reserved!r} would clash with the reward field {reserved!r}, "
                f"which is set from the key {dotted!r}; rename the column, or point the key at "
                "it"
            )
    for f in table.schema:
        if f.name != keys.prompt and not _json_type(f.type):
            raise DataError(
                f"{name}: column {f.name!r} has type {f.type}, which cannot be passed to the "
                "reward (fields must be JSON-serialisable); convert it to a string or number "
                "in the file"
            )
    records = table.to_pylist()
    rows = []
    for i, rec in enumerate(records):
        where = f"row {i} of {name}"
        fields = {c: v for c, v in rec.items() if c != keys.prompt}
        for reserved, dotted in targets.items():
            if dotted:
                fields[reserved] = _lookup(rec, dotted)
        prompt = _lookup(rec, keys.prompt)
        rows.append(Row(where, _check_prompt(prompt, where, keys.prompt), fields, rec))
    return rows


def _check_path(schema, dotted: str, cfg_key: str, name: str) -> None:
    """``dotted`` is a column, or a path of struct fields under one."""
    if dotted in schema.names:
        return
    head, *rest = dotted.split(".")
    if head not in schema.names:
        raise DataError(
            f"{cfg_key}={dotted!r}: {name} has no column {head!r}; its columns: "
            f"{', '.join(schema.names)}. Set {cfg_key} to one of them"
        )
    t, path = schema.field(head).type, head
    for part in rest:
        import pyarrow as pa

        names = [t.field(j).name for j in range(t.num_fields)] if pa.types.is_struct(t) else []
        if part not in names:
            has = f"its fields: {', '.join(names)}" if names else f"it is a {t}, not a struct"
            raise DataError(
                f"{cfg_key}={dotted!r}: in {name}, {path!r} has no field {part!r} ({has}); "
                f"set {cfg_key} to an existing column or dotted path"
            )
        t, path = t.field(part).type, f"{path}.{part}"


def _lookup(rec: dict, dotted: str):
    if dotted in rec:
        return rec[dotted]
    value = rec
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _check_prompt(prompt, where: str, key: str) -> str | list:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(map(_is_message, prompt)):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(
        f"data.prompt_key={key!r}: {where} holds {_short(prompt)}; expected a string or a "
        "non-empty list of chat messages, each {'role': str, 'content': str}"
    )


def _is_message(m) -> bool:
    return (
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
    )


def _json_type(t) -> bool:
    """Whether ``to_pylist`` values of arrow type ``t`` are JSON-serialisable."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _json_type(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _json_type(t.value_type)
    if pa.types.is_struct(t):
        return all(_json_type(t.field(j).type) for j in range(t.num_fields))
    return (
        pa.types.is_null(t)
        or pa.types.is_boolean(t)
        or pa.types.is_integer(t)
        or pa.types.is_float32(t)
        or pa.types.is_float64(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    )


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad_jsonl_line(path: Path, shown: int = 120) -> str:
    """``line N (1-based) is not a JSON object: <why>: '<the line, cut>'`` for the first
    line of ``path`` that is not one JSON object; "" if every line is (pyarrow's complaint
    is then about something else: mixed types, say)."""
    import json

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as e:
                    why = f"{e.msg} at column {e.colno}"
                else:
                    if isinstance(value, dict):
                        continue
                    why = f"it is a JSON {type(value).__name__}, not an object"
                text = line.rstrip("\n")
                text = text if len(text) <= shown else text[:shown] + "..."
                return f"line {n} is not a JSON object ({why}): {text!r}"
    except OSError:
        return ""
    return ""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
