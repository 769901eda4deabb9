"""Prometheus counters read from a role's own tallies at scrape time.

An actor already keeps what its multi-turn episodes and its agents did, for ``actor<i>.json``
(``EpisodeCounts.to_dict()``, ``AgentCounts.to_dict()``); ``TallyCollector`` exports such a
dict as counters when ``/metrics`` is scraped, so nothing is counted twice and the two views
always agree. A ``Tally`` names what to export: plain numbers (``counters``: key -> name,
doc) and ``{label value: number}`` dicts (``labeled``: key -> name, doc, label, the label
values always shown, at 0 until counted). Names follow docs/metrics.md (``_total`` is added
by the exposition).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily

from asyncrl.core.types import EPISODE_ENDS

AGENT_CALL_KINDS = ("first", "extend", "fork", "new")
"""asyncrl/actors/agents/record.py's call kinds (core cannot import the actors' layer)."""


@dataclass(frozen=True)
class Tally:
    counters: dict[str, tuple[str, str]]
    labeled: dict[str, tuple[str, str, str, tuple[str, ...]]] = field(default_factory=dict)


EPISODE_TALLY = Tally(
    {
        "episodes": ("asyncrl_actor_episodes", "Multi-turn training episodes ended."),
        "turns": ("asyncrl_actor_episode_turns", "Model turns of the ended training episodes."),
        "tool_calls": ("asyncrl_actor_episode_tool_calls", "Tool calls the model made."),
        "tool_errors": ("asyncrl_actor_episode_tool_errors", "Tool calls answered an error."),
        "parts": ("asyncrl_actor_episode_parts", "Agents' other call chains made samples."),
        "parts_dropped": (
            "asyncrl_actor_episode_parts_dropped",
            "Agents' other call chains not trained: no prompt token shared with the group's.",
        ),
    },
    {"ends": ("asyncrl_actor_episode_ends", "Training episodes by end.", "end", EPISODE_ENDS)},
)
"""An actor's ``EpisodeCounts`` (asyncrl/actors/episodes/group.py): training episodes."""

AGENT_TALLY = Tally(
    {
        "episodes": ("asyncrl_actor_agent_episodes", "Agent episodes ended (train + validation)."),
        "retries": ("asyncrl_actor_agent_retries", "Endpoint calls the client retried."),
        "streamed": ("asyncrl_actor_agent_streamed", "Endpoint calls answered as a stream."),
        "model_other": ("asyncrl_actor_agent_model_other", "Calls naming another model id."),
        "segments_dropped": ("asyncrl_actor_agent_segments_dropped", "Segments not trained."),
        "model_tokens_dropped": (
            "asyncrl_actor_agent_model_tokens_dropped",
            "Sampled tokens of segments not trained.",
        ),
        "malformed": ("asyncrl_actor_agent_malformed", "Replies with a malformed call block."),
    },
    {
        "ends": ("asyncrl_actor_agent_ends", "Agent episodes by end.", "end", EPISODE_ENDS),
        "calls": ("asyncrl_actor_agent_calls", "Endpoint calls by kind.", "kind", AGENT_CALL_KINDS),
        "refused": (
            "asyncrl_actor_agent_refused",
            "Endpoint calls refused, by reason.",
            "reason",
            (),
        ),
        "overridden": (
            "asyncrl_actor_agent_overridden",
            "Sampling parameters asked and not honoured, by name.",
            "param",
            (),
        ),
    },
)
"""An actor's ``AgentCounts`` (asyncrl/actors/agents/runner.py): training and validation."""


class TallyCollector:
    """Exports ``read()`` (a tally dict) as ``tally`` says, at every scrape."""

    def __init__(self, tally: Tally, read: Callable[[], dict]) -> None:
        self.tally, self.read = tally, read

    def collect(self):
        counts = self.read()
        for key, (name, doc) in self.tally.counters.items():
            yield CounterMetricFamily(name, doc, value=float(counts.get(key, 0)))
        for key, (name, doc, label, shown) in self.tally.labeled.items():
            fam = CounterMetricFamily(name, doc, labels=[label])
            values = {v: 0 for v in shown} | dict(counts.get(key) or {})
            for value, n in sorted(values.items()):
                fam.add_metric([str(value)], float(n))
            yield fam
