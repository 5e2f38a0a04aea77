"""An agent loop of the benchmark's own, for trajectories of several tool rounds.

The built-in ``tool_agent`` loop calls a tool only when the model writes a call, and a
random tiny model writes none; forcing its turns (``forced.py``) would leave the model
nothing to generate but the last one. This loop (an ``engine.agents.loops`` loop, given
to ``AgentRunner(loops=...)``) lets the model generate every turn and then calls ``wait``
itself, whatever the model wrote, with the row's latency for that round
(``extra_info["wait_ms"][round]``), until the turn limit: a model turn, a call, a model
turn, ... So every trajectory generates the same tokens on every path, and a batched
round of turns waits on that round's slowest call, while a streamed trajectory goes on
as soon as its own call has answered.
"""

from __future__ import annotations

import random

from engine.agents.episode import Episode
from engine.agents.tools import ParsedTurn, ToolCall
from engine.agents.trajectory import MAX_TURNS

NAME = "waiting"  # the rows' agent_name


class WaitingLoop:
    async def run(self, episode: Episode) -> None:
        latencies = episode.extra_info["wait_ms"]
        while (turn := await episode.generate()) is not None:
            if not episode.turns_left:  # the last turn: no call after it
                return episode.end(MAX_TURNS)
            if not turn.finished:
                # cut at its length (ignore_eos): close it as the model would have, so
                # that the tool's answer follows a well-formed turn
                episode.add_tokens([episode.chat.tokenizer.eos_token_id])
            ms = latencies[episode.turns - 1]
            parsed = ParsedTurn("", [ToolCall("wait", {"ms": ms})])
            if not episode.add_tool_results(parsed, await episode.call_tools(parsed)):
                return  # over the budget: the episode has ended


def round_latencies(spread: list[int], rounds: int, seed: int) -> list[list[int]]:
    """Each row's latency in each round: every round the same values (its slowest call
    is the spread's largest), dealt to the rows in a fresh seeded order, so that the row
    slow in one round is not the row slow in the next."""
    rng = random.Random(seed)
    by_round = [rng.sample(spread, len(spread)) for _ in range(rounds)]
    return [list(row) for row in zip(*by_round, strict=True)]
