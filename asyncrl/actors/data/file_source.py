"""The ``file`` task: prompts from dataset files, formatted, length-filtered, in seeded epochs.

Load (once per process, ``FileSource.from_config``): read the records (actors/data/datafile.py),
format each prompt, drop the ones longer than ``data.max_prompt_length`` tokens and print
what was dropped (a count and one example); an empty result is an error. Formatting:

- a plain string is used as it is (``Prompt.text``), tokenized like ``tokenizer.encode(text)``;
- a list of chat messages goes through ``tokenizer.apply_chat_template(messages,
  add_generation_prompt=True)``; ``Prompt.text`` is the rendered text (what the model sees,
  as verl's reward manager decodes it), ``Prompt.token_ids`` its tokens (rendered, then
  encoded without special tokens: what ``apply_chat_template(..., tokenize=True)`` does);
- ``data.prompt_template`` (a Jinja2 file, EasyR1's ``format_prompt``) is rendered first with
  ``content`` = the prompt string (for chat: the last user message's content) and the
  record's columns by name; its output replaces that string.

Order (invariants): ``N`` = prompts kept, ``E`` = ``data.epochs``. Index ``i < N * E`` is
position ``i % N`` of epoch ``i // N``; each epoch visits every kept prompt exactly once, in
an order that is a pure function of ``(task.seed, epoch)`` (``random.Random`` seeded with a
string: stable across processes and Python versions), or file order when
``data.shuffle=false``. So ``get(i)`` is a pure function of ``i`` and the data, and the actors'
cursor (buffer/cursors.py) stays exactly-once across restarts and resumes, epochs included.
Indices ``>= end`` do not exist: the source is exhausted there.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.actors.data.datafile import DataError, DataKeys, Row, read_rows
from asyncrl.actors.data.prompt import Prompt

_ENCODE_CHUNK = 1024  # prompts tokenized per batch at load (only their lengths are kept)


@dataclass(frozen=True)
class LoadReport:
    """What loading did: ``records`` read, ``dropped`` as too long (one ``example``), ``empty``
    (no text, or no token once formatted; one ``empty_example``) dropped too, kept."""

    records: int
    dropped: int
    kept: int
    example: str = ""
    empty: int = 0
    empty_example: str = ""


class FileSource:
    """Prompts of dataset records; ``get(i)`` for ``0 <= i < end``. See the module docstring."""

    def __init__(
        self,
        rows: list[Row],
        tokenizer,
        *,
        max_prompt_length: int,
        epochs: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        template=None,
        files_key: str = "data.train_files",
        log: Callable[[str], None] = print,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.epochs = epochs
        self.seed = seed
        self.shuffle = shuffle
        self._orders: dict[int, list[int]] = {}
        lengths = self._lengths(rows)
        empty = [r for r, n in zip(rows, lengths, strict=True) if n == 0 or _blank(r.prompt)]
        blank = {id(r) for r in empty}
        sized = [(r, n) for r, n in zip(rows, lengths, strict=True) if id(r) not in blank]
        self.rows = [r for r, n in sized if n <= max_prompt_length]
        long = [(r, n) for r, n in sized if n > max_prompt_length]
        example = ""
        if long:
            row, n = long[0]
            text = self.format(row)[0]
            example = f"{row.where}: {n} tokens, {text[:120]!r}{'...' if len(text) > 120 else ''}"
        empty_example = f"{empty[0].where}: {empty[0].prompt!r}"[:200] if empty else ""
        self.report = LoadReport(
            len(rows), len(long), len(self.rows), example, len(empty), empty_example
        )
        log(_describe(self.report, files_key, max_prompt_length, epochs, seed, shuffle))
        if not self.rows:
            raise DataError(_none_left(self.report, files_key, max_prompt_length))
        self.size = len(self.rows)
        """Prompts per epoch (N)."""
        self.end = self.size * epochs
        """First index past the data: the source is exhausted there."""

    @classmethod
    def from_config(cls, cfg, model_dir: str, log=print, split: str = "train") -> FileSource:
        """The ``train`` (``data.train_files``, ``data.epochs``) or ``val`` split (one epoch,
        file order) of ``cfg``, tokenized with ``model_dir``'s tokenizer."""
        from asyncrl.core.tokenizer import load_tokenizer

        d, train = cfg.data, split == "train"
        files_key = "data.train_files" if train else "data.val_files"
        keys = DataKeys(d.prompt_key, d.answer_key, d.data_source_key, d.extra_info_key, files_key)
        rows = read_rows(d.train_files if train else d.val_files, keys)
        template = load_template(d.prompt_template) if d.prompt_template else None
        return cls(
            rows,
            load_tokenizer(model_dir),
            max_prompt_length=d.max_prompt_length,
            epochs=d.epochs if train else 1,
            seed=cfg.task.seed,
            shuffle=d.shuffle and train,
            template=template,
            files_key=files_key,
            log=log,
        )

    def epoch_of(self, index: int) -> int:
        return index // self.size

    def get(self, index: int) -> Prompt:
        """The prompt at ``index`` (``0 <= index < end``)."""
        if not 0 <= index < self.end:
            raise IndexError(f"prompt index {index} is outside 0..{self.end - 1}")
        epoch, pos = divmod(index, self.size)
        row = self.rows[self._order(epoch)[pos]]
        text, ids = self.format(row)
        messages = None if isinstance(row.prompt, str) else self._templated(row)
        return Prompt(index, text, dict(row.fields), token_ids=ids, messages=messages)

    def format(self, row: Row) -> tuple[str, list[int]]:
        """(text, token ids) of ``row``'s prompt (module docstring: formatting)."""
        prompt = self._templated(row)
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt)["input_ids"]
        text = self._chat_text(prompt, row)
        return text, self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(self.size))
            if self.shuffle:
                random.Random(f"file:{self.seed}:{epoch}").shuffle(order)
            if len(self._orders) >= 2:  # a cursor moves forward: keep this epoch and the last
                del self._orders[min(self._orders)]
            self._orders[epoch] = order
        return self._orders[epoch]

    def _templated(self, row: Row) -> str | list:
        if self.template is None:
            return row.prompt
        if isinstance(row.prompt, str):
            return self._render(row, row.prompt)
        messages = [dict(m) for m in row.prompt]
        users = [m for m in messages if m["role"] == "user"]
        if not users:
            raise DataError(
                f"data.prompt_template: {row.where} has no user message to format; its roles: "
                f"{[m['role'] for m in messages]}"
            )
        users[-1]["content"] = self._render(row, users[-1]["content"])
        return messages

    def _render(self, row: Row, content: str) -> str:
        try:
            return self.template.render({**row.columns, "content": content})
        except Exception as e:  # jinja2 UndefinedError, TypeError, ... from the user's template
            raise DataError(
                f"data.prompt_template={self.template.name!r} fails on {row.where}: "
                f"{type(e).__name__}: {e}; the template gets 'content' (the prompt) and the "
                f"record's columns: {', '.join(sorted(row.columns))}"
            ) from None

    def _chat_text(self, messages: list, row: Row) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise DataError(
                f"data.prompt_key: {row.where} holds chat messages, but the model's tokenizer "
                "has no chat template; give plain-text prompts, or a model whose tokenizer has "
                "one (tokenizer_config.json 'chat_template' or chat_template.jinja)"
            )
        try:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as e:  # the model's template refused the messages (e.g. roles)
            raise DataError(
                f"data.prompt_key: the tokenizer's chat template fails on {row.where}: "
                f"{type(e).__name__}: {e}"
            ) from None

    def _lengths(self, rows: list[Row]) -> list[int]:
        """Token count of each row's formatted prompt (batched; the ids are not kept)."""
        lengths = [0] * len(rows)
        for special in (True, False):  # plain prompts as encode(text); chat: no specials
            todo = []
            for i, row in enumerate(rows):
                prompt = self._templated(row)
                if isinstance(prompt, str) == special:
                    todo.append((i, prompt if special else self._chat_text(prompt, row)))
            for start in range(0, len(todo), _ENCODE_CHUNK):
                chunk = todo[start : start + _ENCODE_CHUNK]
                enc = self.tokenizer([t for _, t in chunk], add_special_tokens=special)
                for (i, _), ids in zip(chunk, enc["input_ids"], strict=True):
                    lengths[i] = len(ids)
        return lengths


def load_template(path: str):
    """The Jinja2 template in the file ``path`` (``data.prompt_template``), sandboxed and
    strict: a name the template uses that a record lacks is an error, not an empty string."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    file = Path(path).expanduser()
    try:
        source = file.read_text()
    except OSError as e:
        raise DataError(
            f"data.prompt_template={path!r} cannot be read ({e.strerror or e}); give the path "
            "of a Jinja2 file, or '' for none"
        ) from None
    env = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined)
    try:
        template = env.from_string(source.strip())
    except jinja2.TemplateSyntaxError as e:
        raise DataError(
            f"data.prompt_template={path!r} is not a valid Jinja2 template: line {e.lineno}: "
            f"{e.message}"
        ) from None
    template.name = path
    return template


def _blank(prompt: str | list) -> bool:
    """No text to prompt with: an empty or whitespace string, or chat messages whose every
    content is (vLLM refuses an empty prompt; a template around nothing asks nothing)."""
    if isinstance(prompt, str):
        return not prompt.strip()
    return all(not str(m.get("content") or "").strip() for m in prompt)


def _none_left(r: LoadReport, key: str, limit: int) -> str:
    why = []
    if r.dropped:
        why.append(
            f"{r.dropped} longer than data.max_prompt_length={limit} tokens (e.g. "
            f"{r.example}); raise data.max_prompt_length (up to the model's context "
            "minus sampling.max_tokens)"
        )
    if r.empty:
        why.append(f"{r.empty} empty (e.g. {r.empty_example}); check data.prompt_key")
    return f"{key}: no prompt is left of {r.records}: " + "; ".join(why)


def _describe(r: LoadReport, key: str, limit: int, epochs: int, seed: int, shuffle: bool) -> str:
    order = f"shuffled per epoch (seed {seed})" if shuffle else "in file order"
    dropped = (
        f"; dropped {r.dropped} longer than data.max_prompt_length={limit} tokens "
        f"(e.g. {r.example})"
        if r.dropped
        else f"; none longer than data.max_prompt_length={limit} tokens"
    )
    if r.empty:
        dropped += f"; dropped {r.empty} empty (e.g. {r.empty_example})"
    return f"{key}: {r.records} records{dropped}; {r.kept} prompts x {epochs} epoch(s), {order}"
