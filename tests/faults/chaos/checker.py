"""The chaos run's independent checker: what docs/reliability.md promises, proved from what the
job left behind, with none of asyncrl's own counting (no asyncrl import at all).

Sources: the buffer's history (the Redis AOF, aof.py), its final state (the AOF reopened by a
redis-server of our own), the checkpoints' files, ``metrics.jsonl``, and what the harness saw
(harness.py): every line of the console and of ``learner.log`` with the time it appeared, and
every fault it injected.

Properties (each violation names one):

``history``     the AOF reads as the buffer's key layout: every deletion from the stream is
                counted in one terminal state in the same transaction, every count has its
                deletion, every delivery and end is of a committed entry, no incr file missed.
``one-end``     every committed group ended in exactly one counted state (trained, dropped
                stale/invalid/poison/uniform) or is still in the stream; a group acked
                ``trained`` completed a step first; ``N:stats`` equals those counts, and
                ``committed`` the commits (each group id once).
``final``       the reopened Redis holds exactly the groups the history left in the stream,
                the same counters, and the conservation law.
``trained-once`` a group trained twice only across a learner restart, and only if the step
                that trained it first was past the checkpoint the new learner resumed from
                (at-least-once training after a learner crash; never twice otherwise).
``staleness``   every completed step trained groups within ``max_staleness`` of the version it
                read at (judged on the oldest token, or the newest with
                ``algorithm.stale_tokens=mask|interpolate``); a negative staleness only for
                tokens of versions the run had sent before the learner restarted; every group
                dropped as stale was stale.
``future``      no group carries tokens of a version the learner had not sent when it was
                committed.
``versions``    a learner publishes versions one step apart; each restart resumes at or after
                the previous one's start, no later than any version reached, and at the newest
                checkpoint that was complete when it started; checkpoints carry their own
                version and every file at its manifest's size and hash; ``metrics.jsonl`` goes
                one version a record, going back only to a restart's version.
``checkpoints`` a group is in at most one checkpoint; a checkpoint holds only trained groups;
                a group acked trained is in the checkpoint after its step (unless pruned).
``weights``     an actor that committed tokens of version V (it announced V) starts no later
                group on older weights, and no sample goes back in version, unless the learner
                restarted (a rollback: the new learner sends its checkpoint's weights) or the
                actor was restarted in between.
``silence``     nothing waited without a message: while the learner ran (not SIGSTOPped by us)
                its log was never silent for more than ``silence_s`` (each wait reports every
                15 s, a lost Redis connection at the 30 s socket timeout, a weight sync at its
                deadline).
``deaths``      every kill was announced by the launcher (restarting the role, or Redis), and
                no role died that was not killed (kills from 2 s before the first sign of a
                job's failure, a ``FatalError`` or ``FAILED``, are not counted: the job is
                stopping its roles then).
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.chaos import aof
from tests.faults.chaos.aof import TERMINAL, History

ENDING = re.compile(r"\[asyncrl\] FAILED|FatalError")
"""A console line that shows the job failing (an error a restart cannot fix, or the
launcher's verdict): the harness stops injecting, ``deaths`` stops counting."""
_DEATH = re.compile(
    r"\[asyncrl\] (\w+) (exited with code -?\d+|killed by \w+); restarting it"
    r"|redis-server exited \((-?\d+)\); restarted from"
)
"""How a launcher announces a death it recovers from (launch/launcher.py ``restart``, the
buffer's ``RedisServer.watch``)."""


@dataclass(frozen=True)
class Violation:
    prop: str
    text: str

    def __str__(self) -> str:
        return f"[{self.prop}] {self.text}"


@dataclass(frozen=True)
class Rules:
    """The promises' parameters (``of``: from the job's config.json)."""

    max_staleness: int
    judge_newest: bool = False
    """``algorithm.stale_tokens`` is mask or interpolate: a group's newest token is judged."""
    silence_s: float = 45.0
    """The longest the learner may stay silent (module docstring)."""
    checkpoint_slack_s: float = 1.0
    """Clock slack between a checkpoint's marker (file time) and a learner's start (Redis)."""

    @classmethod
    def of(cls, config: dict, silence_s: float) -> Rules:
        newest = config.get("algorithm", {}).get("stale_tokens") in ("mask", "interpolate")
        return cls(int(config["buffer"]["max_staleness"]), newest, silence_s)


@dataclass
class Checkpoint:
    version: int
    """From the directory name ``step_<V>``."""
    marker: str
    """The COMPLETE marker's text."""
    marker_mtime: float
    trained_ids: list[str]
    problems: list[str] = field(default_factory=list)
    """Files missing or not at their manifest's size or hash."""


@dataclass
class Fault:
    """One fault as the harness injected it (``<chaos>/faults.jsonl``)."""

    t: float
    kind: str
    target: str
    end: float | None = None
    """When it ended (SIGCONT, heal, disk emptied); None for a kill."""
    note: str = ""
    """Why it was not injected (its process was not running), or ""."""


# -- the buffer's history -----------------------------------------------------------------------


def check_history(
    h: History,
    rules: Rules,
    kills: dict[str, list[float]] | None = None,
    outages: list[tuple[float, float]] | None = None,
) -> list[Violation]:
    """``history``, ``one-end``, ``trained-once``, ``staleness``, ``future``, the learner's part
    of ``versions``, and ``weights``; ``kills``: process name -> kill times (s, wall clock);
    ``outages``: spans (s) in which Redis could not hear a role (stopped, killed, a host cut
    off): a killed actor's last commands may reach it only at their end."""
    out = [Violation("history", p) for p in h.problems]
    out += _one_end(h)
    out += _trained_once(h)
    out += _staleness(h, rules)
    out += _learner_versions(h)
    out += _weights(h, kills or {}, outages or [])
    return out


def _one_end(h: History) -> list[Violation]:
    out = []
    counted = dict.fromkeys(TERMINAL, 0)
    for e in h.entries.values():
        name = f"group {e.group_id} ({e.entry_id})"
        for state, _, _ in e.ends:
            counted[state] += 1
        if len(e.ends) > 1:
            states = ", ".join(f"{s} (tx {k})" for s, k, _ in e.ends)
            out.append(Violation("one-end", f"{name} ended {len(e.ends)} times: {states}"))
        if e.ends and e.ends[0][0] == "trained" and not any(s.tx < e.ends[0][1] for s in e.steps):
            out.append(Violation("one-end", f"{name} was acked trained without a completed step"))
    for state in TERMINAL:
        if h.stats.get(state, 0) != counted[state]:
            out.append(Violation("one-end", f"{h.name}:stats {state} is {h.stats.get(state, 0)}, "
                                 f"but {counted[state]} groups ended {state}"))  # fmt: skip
    if h.stats.get("committed", 0) != len(h.entries):
        out.append(Violation("one-end", f"{h.name}:stats committed is "
                             f"{h.stats.get('committed', 0)}, but {len(h.entries)} groups were "
                             "committed"))  # fmt: skip
    gids = [e.group_id for e in h.entries.values()]
    if len(set(gids)) != len(gids):
        twice = sorted({g for g in gids if gids.count(g) > 1})[:5]
        out.append(Violation("one-end", f"group ids committed twice: {twice}"))
    if h.group_ids != set(gids):
        out.append(Violation("one-end", f"{h.name}:group_ids has {len(h.group_ids)} ids, the "
                             f"stream got {len(set(gids))}"))  # fmt: skip
    return out


def _trained_once(h: History) -> list[Violation]:
    out = []
    for e in h.entries.values():
        name = f"group {e.group_id} ({e.entry_id})"
        for prev, step in zip(e.steps, e.steps[1:], strict=False):
            if step.incarnation == prev.incarnation:
                out.append(Violation("trained-once", f"{name} trained twice by one learner (at "
                                     f"versions {prev.version} and {step.version}, no restart "
                                     "between)"))  # fmt: skip
                continue
            start = h.incarnations[step.incarnation].start_version
            if start is not None and prev.version < start:
                out.append(Violation("trained-once", f"{name} trained again by the learner that "
                                     f"resumed at version {start}, but its step at version "
                                     f"{prev.version} was in that checkpoint"))  # fmt: skip
    return out


def _staleness(h: History, rules: Rules) -> list[Violation]:
    out = []
    bound = rules.max_staleness
    for e in h.entries.values():
        if e.payload is None:
            continue
        p, name = e.payload, f"group {e.group_id} ({e.entry_id})"
        judged = p.version_max if rules.judge_newest else p.version_min
        if p.version_max > max(0, e.sent_max):
            out.append(Violation("future", f"{name} has tokens of version {p.version_max}, but "
                                 f"the learner had sent no version past {max(0, e.sent_max)} "
                                 "when it was committed"))  # fmt: skip
        for s in e.steps:
            lag = s.version - judged
            if lag > bound:
                out.append(Violation("staleness", f"{name}, versions {p.version_min}.."
                                     f"{p.version_max}, trained at version {s.version}: "
                                     f"staleness {lag} > max_staleness {bound}"))  # fmt: skip
            ceiling = h.incarnations[s.incarnation].sent_before if s.incarnation >= 0 else -1
            if lag < 0 and p.version_max > max(s.version, ceiling):
                out.append(Violation("staleness", f"{name} trained at version {s.version} with "
                                     f"tokens of version {p.version_max}: negative staleness; "
                                     f"no learner had sent past {ceiling}"))  # fmt: skip
        for state, k, version in e.ends:
            if state == "dropped_stale" and version - judged <= bound:
                out.append(Violation("staleness", f"{name}, version {judged}, dropped as stale "
                                     f"at learner version {version} (tx {k}): it was within "
                                     f"max_staleness {bound}"))  # fmt: skip
    return out


def _learner_versions(h: History) -> list[Violation]:
    out = []
    reached, prev_start = -1, None
    for n, inc in enumerate(h.incarnations):
        who = f"learner {n} (pid {inc.pid})"
        vs = [v for _, v in inc.versions]
        for a, b in zip(vs, vs[1:], strict=False):
            if b not in (a, a + 1):
                out.append(Violation("versions", f"{who} published version {b} right after {a}"))
                break
        if not vs:
            continue
        if prev_start is not None and vs[0] < prev_start:
            out.append(Violation("versions", f"{who} resumed at version {vs[0]}, before the "
                                 f"previous learner's start {prev_start}"))  # fmt: skip
        if n and vs[0] > max(reached, 0):
            out.append(Violation("versions", f"{who} resumed at version {vs[0]}, past every "
                                 f"version reached before ({reached})"))  # fmt: skip
        prev_start, reached = vs[0], max(reached, *vs)
    return out


def _weights(
    h: History,
    kills: dict[str, list[float]],
    outages: list[tuple[float, float]],
    slack_ms: float = 1500.0,
) -> list[Violation]:
    """``weights`` (module docstring). A group's tokens are generated after its prompt index
    was claimed (``claim_tx``) and before its commit. A restart of the learner between two
    commits excuses older weights in the second (the new learner sends its checkpoint's); a
    kill of the actor does too: its time is mapped onto the history with ``slack_ms``, to the
    end of an outage under way (the dead actor's last commit may land only then)."""
    out = []
    restarts = [inc.tx for inc in h.incarnations[1:]]

    def span(t: float) -> tuple[int, int]:
        until = max([t] + [b for a, b in outages if a - 1.0 <= t <= b + 1.0])
        lo, _ = h.tx_span(t * 1000, slack_ms)
        return lo, h.tx_span(until * 1000, slack_ms)[1]

    by_actor: dict[int, list] = {}
    for eid in h.order:
        e = h.entries[eid]
        if e.payload is not None and e.actor >= 0:
            by_actor.setdefault(e.actor, []).append(e)
    for actor, groups in by_actor.items():
        resets = [(s, s) for s in restarts]
        resets += [span(t) for t in kills.get(f"actor{actor}", [])]
        commits = [g.commit_tx for g in groups]
        newest = _MaxTable([g.payload.version_max for g in groups])
        for g in groups:
            # the earlier groups that count: committed after the last reset, before g's claim
            since = max((hi for lo, hi in resets if lo < g.commit_tx), default=-1)
            i, j = bisect.bisect_right(commits, since), bisect.bisect_left(commits, g.claim_tx)
            if g.claim_tx >= 0 and i < j:
                floor, at = newest.query(i, j)
                if g.payload.version_min < floor:
                    g1 = groups[at]
                    out.append(Violation("weights", f"actor{actor} committed group {g1.group_id} "
                                         f"with tokens of version {floor} (tx {g1.commit_tx}), "
                                         f"then generated group {g.group_id} (prompt claimed at "
                                         f"tx {g.claim_tx}) from version "
                                         f"{g.payload.version_min}: older weights, with no "
                                         "learner or actor restart between"))  # fmt: skip
            rolled = any(g.claim_tx < s < g.commit_tx for s in restarts)
            if not g.payload.monotone and not rolled:
                out.append(Violation("weights", f"a sample of group {g.group_id} (actor{actor}) "
                                     "goes back in version along its tokens, with no learner "
                                     "restart during it"))  # fmt: skip
    return out


class _MaxTable:
    """Range maximum, with its index, over a fixed list (a sparse table)."""

    def __init__(self, values: list[int]) -> None:
        self.rows = [[(v, i) for i, v in enumerate(values)]]
        width = 1
        while 2 * width <= len(values):
            prev = self.rows[-1]
            n = len(values) - 2 * width + 1
            self.rows.append([max(prev[i], prev[i + width]) for i in range(n)])
            width *= 2

    def query(self, i: int, j: int) -> tuple[int, int]:
        """(max of values[i:j], an index of it); needs i < j."""
        level = (j - i).bit_length() - 1
        row = self.rows[level]
        return max(row[i], row[j - (1 << level)])


# -- the final state ----------------------------------------------------------------------------


def check_final(h: History, final: dict) -> list[Violation]:
    """``final``; ``final`` is ``read_final``'s dict of the reopened Redis."""
    out = []
    live, ids = set(h.live()), set(final["stream_ids"])
    if live != ids:
        out.append(Violation("final", f"the stream holds {len(ids)} entries, the history left "
                             f"{len(live)}: missing {sorted(live - ids)[:5]}, unexpected "
                             f"{sorted(ids - live)[:5]}"))  # fmt: skip
    stats = {k: int(v) for k, v in final["stats"].items()}
    for k in ("committed", *TERMINAL):
        if stats.get(k, 0) != h.stats.get(k, 0):
            out.append(Violation("final", f"{h.name}:stats {k} is {stats.get(k, 0)} in Redis, "
                                 f"{h.stats.get(k, 0)} by the history"))  # fmt: skip
    ended = sum(stats.get(k, 0) for k in TERMINAL)
    if stats.get("committed", 0) != ended + len(ids):
        out.append(Violation("final", f"conservation: committed {stats.get('committed', 0)} != "
                             f"ended {ended} + still in the stream {len(ids)}"))  # fmt: skip
    if final["group_ids"] != len(h.group_ids) or final["commits"] != len(ids):
        out.append(Violation("final", f"{final['group_ids']} group ids and {final['commits']} "
                             f"commit records in Redis; {len(h.group_ids)} group ids committed, "
                             f"{len(ids)} entries in the stream"))  # fmt: skip
    dead = stats.get("dropped_invalid", 0) + stats.get("dropped_poison", 0)
    if final["dead"] != dead or final["dead"] != h.dead:
        out.append(Violation("final", f"{final['dead']} dead letters, {dead} counted invalid or "
                             f"poison, {h.dead} added by the history"))  # fmt: skip
    return out


def read_final(redis_dir: Path, name: str, timeout_s: float = 60.0) -> dict:
    """The buffer's final state: a copy of ``redis_dir``'s AOF loaded by a redis-server of our
    own (no password, a unix socket), read with the ``redis`` client."""
    import redis

    with tempfile.TemporaryDirectory(prefix="chaos-final-") as tmp:
        work = Path(tmp)
        shutil.copytree(redis_dir / "appendonlydir", work / "appendonlydir")
        sock = work / "redis.sock"
        cmd = ["redis-server", "--port", "0", "--unixsocket", str(sock), "--dir", str(work),
               "--appendonly", "yes", "--aof-load-truncated", "yes", "--save", "",
               "--logfile", str(work / "redis.log")]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            client = redis.Redis(unix_socket_path=str(sock))
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if client.ping() and client.info("persistence").get("loading") == 0:
                        break
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (work / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server did not load {redis_dir}:\n{log}")
                time.sleep(0.1)
            exists = lambda key: bool(client.exists(key))  # noqa: E731
            stats = client.hgetall(f"{name}:stats")
            return {
                "stream_ids": [i.decode() for i, _ in client.xrange(name)] if exists(name) else [],
                "stats": {k.decode(): v.decode() for k, v in stats.items()},
                "group_ids": client.scard(f"{name}:group_ids"),
                "commits": client.hlen(f"{name}:commits"),
                "dead": client.xlen(f"{name}:dead") if exists(f"{name}:dead") else 0,
            }
        finally:
            proc.kill()
            proc.wait(10)


# -- checkpoints and metrics.jsonl --------------------------------------------------------------


def read_checkpoints(folder: Path) -> list[Checkpoint]:
    """Every ``step_<V>`` directory of ``folder`` (leftovers are ``.tmp-*`` / ``.old-*``), its
    marker, its trained ids, and its files against its manifest (sizes; XXH3 where the
    ``xxhash`` package is installed)."""
    out = []
    for d in sorted(folder.glob("step_*")):
        m = re.fullmatch(r"step_(\d+)", d.name)
        if not m:
            continue
        marker = d / "COMPLETE"
        text = marker.read_text().strip() if marker.is_file() else ""
        ck = Checkpoint(int(m.group(1)), text, marker.stat().st_mtime if text else 0.0, [])
        try:
            ck.trained_ids = list(json.loads((d / "state.json").read_text())["trained_ids"])
            files = json.loads((d / "manifest.json").read_text())["files"]
        except (OSError, ValueError, KeyError) as e:
            ck.problems.append(f"state.json or manifest.json unreadable: {e}")
            files = {}
        for rel, want in files.items():
            ck.problems += _file_problem(d / rel, want)
        out.append(ck)
    return out


def _file_problem(path: Path, want: dict) -> list[str]:
    if not path.is_file():
        return [f"{path.name} is missing"]
    size = path.stat().st_size
    if size != want.get("bytes"):
        return [f"{path.name} has {size} bytes, its manifest says {want.get('bytes')}"]
    try:
        import xxhash
    except ImportError:  # sizes only
        return []
    digest = xxhash.xxh3_64_hexdigest(path.read_bytes())
    return [] if digest == want.get("xxh3", digest) else [f"{path.name} does not hash as listed"]


def check_checkpoints(h: History, ckpts: list[Checkpoint], rules: Rules) -> list[Violation]:
    """``checkpoints`` and the checkpoint part of ``versions`` (module docstring)."""
    out = []
    for ck in ckpts:
        if ck.marker != str(ck.version):
            out.append(Violation("versions", f"checkpoint step_{ck.version} is marked "
                                 f"{ck.marker!r}"))  # fmt: skip
        out += [Violation("versions", f"checkpoint step_{ck.version}: {p}") for p in ck.problems]
    holder: dict[str, int] = {}
    for ck in ckpts:
        for eid in ck.trained_ids:
            where = f"step_{ck.version} holds {eid}"
            if eid in holder:
                out.append(Violation("checkpoints", f"{where}, and step_{holder[eid]} does too: "
                                     "trained twice across a durable checkpoint"))  # fmt: skip
            holder[eid] = ck.version
            e = h.entries.get(eid)
            if e is None:
                out.append(Violation("checkpoints", f"{where}, which was never committed"))
                continue
            if any(state != "trained" for state, _, _ in e.ends):
                out.append(Violation("checkpoints", f"{where}, which ended {e.ends[0][0]}"))
            if not any(s.version < ck.version for s in e.steps):
                out.append(Violation("checkpoints", f"{where}, which no step before that "
                                     "version trained"))  # fmt: skip
    oldest = min((ck.version for ck in ckpts), default=None)
    for e in h.entries.values():
        if not e.ends or e.ends[0][0] != "trained" or not e.steps or e.entry_id in holder:
            continue
        if oldest is not None and e.steps[-1].version >= oldest:
            out.append(Violation("checkpoints", f"group {e.group_id} ({e.entry_id}) was acked "
                                 f"trained (its step at version {e.steps[-1].version}), but no "
                                 "checkpoint holds it"))  # fmt: skip
    for n, inc in enumerate(h.incarnations[1:], start=1):
        start = inc.start_version
        if start is None:
            continue
        before = inc.ms - rules.checkpoint_slack_s * 1000
        newer = [c.version for c in ckpts if c.marker_mtime * 1000 < before and c.version > start]
        if newer:
            out.append(Violation("versions", f"learner {n} (pid {inc.pid}) resumed at version "
                                 f"{start}, but checkpoint step_{max(newer)} was complete "
                                 "before it started"))  # fmt: skip
    return out


def read_metrics(path: Path) -> tuple[list[dict], int]:
    """``metrics.jsonl``'s records, and how many lines are not JSON (torn by a killed
    learner)."""
    records, torn = [], 0
    if not path.is_file():
        return records, torn
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            torn += 1
    return records, torn


def check_metrics(h: History, records: list[dict], torn: int, rules: Rules) -> list[Violation]:
    """The ``metrics.jsonl`` part of ``versions`` and ``staleness``."""
    out = []
    if torn > max(0, len(h.incarnations) - 1):
        out.append(Violation("versions", f"{torn} torn lines in metrics.jsonl, "
                             f"{len(h.incarnations) - 1} learner restarts"))  # fmt: skip
    starts = [inc.start_version for inc in h.incarnations[1:] if inc.start_version is not None]
    prev = None
    for n, r in enumerate(records):
        step, version = r.get("step", -2), r.get("version")
        if version != step + 1:
            out.append(Violation("versions", f"metrics.jsonl record {n}: version {version} "
                                 f"after step {step}"))  # fmt: skip
        if r.get("staleness_max", 0) > rules.max_staleness:
            out.append(Violation("staleness", f"metrics.jsonl step {step}: staleness_max "
                                 f"{r['staleness_max']} > {rules.max_staleness}"))  # fmt: skip
        if prev is not None and version != prev + 1:
            if step in starts:  # a restart resumed there
                starts = starts[starts.index(step) + 1 :]
            else:
                out.append(Violation("versions", f"metrics.jsonl goes from version {prev} to "
                                     f"{version}, and no learner resumed at {step}"))  # fmt: skip
        prev = version
    return out


# -- what the harness saw -----------------------------------------------------------------------


def silences(
    lines: list[tuple[float, str]], stopped: list[tuple[float, float]], start: float, end: float
) -> list[tuple[float, float, float]]:
    """(silent seconds, from, to) of each gap between ``lines`` (time, text) from ``start`` to
    ``end``, less the time the process was SIGSTOPped (``stopped`` spans)."""
    times = [start] + sorted(t for t, _ in lines if start < t < end) + [end]
    out = []
    for a, b in zip(times, times[1:], strict=False):
        held = sum(max(0.0, min(b, t1) - max(a, t0)) for t0, t1 in stopped)
        out.append((b - a - held, a, b))
    return out


def check_silence(
    lines: list[tuple[float, str]],
    stopped: list[tuple[float, float]],
    start: float,
    end: float,
    limit_s: float,
    what: str = "learner.log",
) -> list[Violation]:
    """``silence`` (module docstring) for one log."""
    out = []
    for silent, a, b in silences(lines, stopped, start, end):
        if silent > limit_s:
            before = next((text for t, text in reversed(lines) if t <= a), "(nothing yet)")
            out.append(Violation("silence", f"{what} was silent for {silent:.0f}s (from "
                                 f"{a - start:.0f}s to {b - start:.0f}s after the first step) "
                                 f"while the learner ran; its last line before: "
                                 f"{before[:200]!r}"))  # fmt: skip
    return out


def check_deaths(
    console: list[tuple[float, str]], faults: list[Fault], end: float
) -> list[Violation]:
    """``deaths``: each kill injected before ``end`` announced once, no other death."""
    deaths: dict[str, list[str]] = {}
    for _, text in console:
        if m := _DEATH.search(text):
            role = "redis" if m.group(3) is not None else m.group(1)
            deaths.setdefault(role, []).append(m.group(0))
    kills: dict[str, int] = {}
    for f in faults:
        if f.kind == "kill" and f.t < end and not f.note:
            kills[f.target] = kills.get(f.target, 0) + 1
    out = []
    for role in sorted(set(deaths) | set(kills)):
        said, n = deaths.get(role, []), kills.get(role, 0)
        if len(said) != n:
            text = f"{role}: {n} kill(s) injected, {len(said)} death(s) announced: {said}"
            out.append(Violation("deaths", text))
    return out


# -- everything ---------------------------------------------------------------------------------


@dataclass
class Evidence:
    """What a chaos run left (harness.py and test_chaos.py write the chaos folder)."""

    run_dir: Path
    """The learner's run directory: config.json, metrics.jsonl."""
    checkpoints: Path
    """The ``step_<V>`` directories (a copy of ``<learner.checkpoint_dir>/checkpoints``)."""
    chaos_dir: Path
    redis_dir: Path
    config: dict
    faults: list[Fault]
    console: list[tuple[float, str]]
    """Every launcher's output lines, with the times they appeared."""
    learner_log: list[tuple[float, str]]
    start: float
    """When the chaos started (the first step), wall clock."""
    end: float
    """When the job ended."""

    @classmethod
    def load(cls, chaos_dir: Path) -> Evidence:
        info = json.loads((chaos_dir / "run.json").read_text())
        run_dir = Path(info["run_dir"])
        lines = [(r["t"], r["source"], r["text"]) for r in _jsonl(chaos_dir / "lines.jsonl")]
        return cls(
            run_dir=run_dir,
            checkpoints=Path(info["checkpoints"]),
            chaos_dir=chaos_dir,
            redis_dir=Path(info["redis_dir"]),
            config=json.loads((run_dir / "config.json").read_text()),
            faults=[Fault(**f) for f in _jsonl(chaos_dir / "faults.jsonl")],
            console=[(t, x) for t, s, x in lines if s.startswith("console")],
            learner_log=[(t, x) for t, s, x in lines if s == "learner"],
            start=info["start"],
            end=info["end"],
        )


def _jsonl(path: Path) -> Iterable[dict]:
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def check(ev: Evidence, silence_s: float = 45.0) -> tuple[list[Violation], dict]:
    """Every property (module docstring) of a finished chaos run: the violations, and what was
    checked (for the report)."""
    name = ev.config["buffer"]["name"]
    rules = Rules.of(ev.config, silence_s)
    txs, problems = aof.read_files(aof.incr_files(ev.chaos_dir / "aof"))
    h = aof.replay(txs, name)
    h.problems[:0] = problems
    kills: dict[str, list[float]] = {}
    for f in ev.faults:
        if f.kind == "kill" and not f.note:
            kills.setdefault(f.target, []).append(f.t)
    outages = [(f.t, f.end if f.end is not None else f.t + 5.0) for f in ev.faults if not f.note
               and (f.target == "redis" or f.kind == "partition")]  # fmt: skip
    out = check_history(h, rules, kills, outages)
    out += check_final(h, read_final(ev.redis_dir, name))
    ckpts = read_checkpoints(ev.checkpoints)
    out += check_checkpoints(h, ckpts, rules)
    records, torn = read_metrics(ev.run_dir / "metrics.jsonl")
    out += check_metrics(h, records, torn, rules)
    stopped = [(f.t, f.end if f.end is not None else ev.end) for f in ev.faults
               if f.kind == "stop" and f.target == "learner" and not f.note]  # fmt: skip
    out += check_silence(ev.learner_log, stopped, ev.start, ev.end, rules.silence_s)
    # a failing job stops its roles: deaths from then on are not announced
    failed = next((t for t, x in ev.console if ENDING.search(x)), None)
    out += check_deaths(ev.console, ev.faults, ev.end if failed is None else failed - 2.0)
    ends: dict[str, int] = {}
    for e in h.entries.values():
        key = e.ends[0][0] if e.ends else "still_buffered"
        ends[key] = ends.get(key, 0) + 1
    quiet = max((s for s, _, _ in silences(ev.learner_log, stopped, ev.start, ev.end)), default=0)
    seen = {
        "transactions": len(txs),
        "groups": len(h.entries),
        "ends": ends,
        "trained_again": sum(len(e.steps) > 1 for e in h.entries.values()),
        "learners": len(h.incarnations),
        "checkpoints": len(ckpts),
        "metrics_records": len(records),
        "longest_learner_silence_s": round(quiet, 1),
    }
    return out, seen


def main(argv: list[str]) -> int:
    """``python -m tests.faults.chaos.checker <tmp>/chaos``: check a kept chaos run again."""
    if len(argv) != 1:
        print("usage: python -m tests.faults.chaos.checker <tmp>/chaos")
        return 2
    violations, seen = check(Evidence.load(Path(argv[0])))
    print(json.dumps(seen))
    for v in violations:
        print(v)
    print(f"{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
