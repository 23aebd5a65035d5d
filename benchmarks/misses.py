"""Why each missed deadline of a run was missed, from its hosts' spans.

``python -m benchmarks.misses LOG_DIR [--step-timeout SECONDS]`` reads the span files a
run's hosts wrote (``spans-host-N.jsonl``: the soak's ``demo-output/soak/logs``) and
classifies every supervisor reset and give-up (a missed deadline that was counted) by what
happened to the same attempt (order, attempt): its claim, its agent's run, and the
scheduler's recording of its answer. The soak reports the counts; docs/scale.md ("The soak
under push-back") shows what they told about the app.

- ``answered in time, recorded late``: the agent answered before the deadline, and the
  answer reached the scheduler after it: the app's own plumbing (a backlog on the
  responses queue), never the remote's failure;
- ``no answer from the remote``: the agent's calls ended without a result (the remote's
  own failure, as the step's policy counts it);
- ``reached the agent late`` / ``never reached an agent``: the request's way out;
- ``answered late``: the agent's answer itself came after the deadline;
- ``unknown``: no claim span (a killed host's spans are lost with it).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from core import names

ANSWERED_IN_TIME_RECORDED_LATE = "answered in time, recorded late"
NO_ANSWER = "no answer from the remote"
#: Outcomes of an agent's run that are an answer (core.models.Outcome values).
_NO_RESPONSE = ("no_response", None)
_CLAIMS = (names.SPAN_CLAIM, names.SPAN_COMPENSATE)
_COUNTED = {f"{names.SPAN_SUPERVISOR_PREFIX}retry": "retry", f"{names.SPAN_SUPERVISOR_PREFIX}give_up": "give_up"}


def _seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def classify(log_dir: Path, step_timeout: float) -> dict[str, dict[str, int]]:
    """Verdict (``retry``, ``give_up``) -> cause -> count, for every miss the supervisor wrote."""
    claims: dict[tuple, float] = {}
    runs: defaultdict[tuple, list[tuple[float, float, str | None]]] = defaultdict(list)
    recorded: defaultdict[tuple, list[float]] = defaultdict(list)
    misses: list[tuple[tuple, str]] = []
    for path in sorted(log_dir.glob("spans-host-*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                span = json.loads(line)
            except ValueError:
                continue  # a line cut short by a killed host
            attributes = span.get("attributes", {})
            key = (attributes.get("order.id"), attributes.get("order.attempt"))
            name = span.get("name")
            if name in _CLAIMS:
                claims.setdefault(key, _seconds(span["start"]))
            elif name == names.SPAN_AGENT:
                runs[key].append((_seconds(span["start"]), _seconds(span["end"]), attributes.get("order.outcome")))
            elif name == names.SPAN_RECORD:
                recorded[key].append(_seconds(span["start"]))
            elif name in _COUNTED and attributes.get("order.outcome") == _COUNTED[name]:
                misses.append((key, _COUNTED[name]))
    found: dict[str, Counter] = {"retry": Counter(), "give_up": Counter()}
    for key, verdict in misses:
        found[verdict][_cause(key, claims, runs, recorded, step_timeout)] += 1
    return {verdict: dict(counts) for verdict, counts in found.items()}


def _cause(key, claims, runs, recorded, step_timeout: float) -> str:
    if key not in claims:
        return "unknown"
    deadline = claims[key] + step_timeout
    started = [run for run in runs.get(key, []) if run[0] < deadline]
    if not runs.get(key):
        return "never reached an agent"
    if not started:
        return "reached the agent late"
    answers = [end for _, end, outcome in started if outcome not in _NO_RESPONSE]
    if not answers:
        return NO_ANSWER
    if min(answers) >= deadline:
        return "answered late"
    if any(at < deadline for at in recorded.get(key, [])):
        return "recorded in time"
    return ANSWERED_IN_TIME_RECORDED_LATE


def main(
    log_dir: Annotated[Path, typer.Argument(help="A run's log folder, with its spans-host-N.jsonl files.")],
    step_timeout: Annotated[float, typer.Option(help="The run's STEP_TIMEOUT_SECONDS.")] = 12.0,
) -> None:
    """Print the run's missed deadlines by verdict and cause, as JSON."""
    typer.echo(json.dumps(classify(log_dir, step_timeout), indent=2))


if __name__ == "__main__":
    typer.run(main)
