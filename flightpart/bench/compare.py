"""``flightpart bench --compare OLD.json``: each case of a run against the same case of an earlier run.

Two runs on one machine differ by noise, so a slower figure alone proves
nothing. Each case's contenders run alternately, so run ``i`` of flightpart
and run ``i`` of its baseline shared the machine's state: their ratio per run
cancels most of a busy moment. The comparison is therefore made on the speed
ratio against the baseline (not on raw time), and the noise is measured, not
assumed: the spread (interquartile range over the median) of the per-run
ratios of both runs, or, when wider, how far the case moved between whole runs
of one code among the runs kept (see :mod:`flightpart.bench.history`). A case
is flagged slower when its ratio fell by more than that noise (and by at least
:data:`FLOOR`); a case without a baseline is compared on its own median with
the spread of its own runs (and between runs of one code).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from .history import carried, noise_between_runs

FLOOR = 0.05
"""The smallest change flagged, even when both runs were very steady."""


@dataclass(frozen=True)
class Change:
    """One case of a run against the same case of an earlier run."""

    case: str
    measure: str  # "ratio vs <baseline>" or "median of <contender>"
    old: float
    new: float
    change: float  # > 0: better (a higher ratio, a lower time)
    noise: float  # the relative spread measured within the two runs, or between runs of one code when wider
    verdict: str  # "slower", "faster", "same", "new", "gone"
    repeats: int = 0  # runs of one code the noise between runs was seen in (0: none kept, the noise is within runs)

    def as_json(self) -> dict:
        return asdict(self)


def compare(old: dict, new: dict) -> list[Change]:
    """Every case of ``new`` against ``old`` (by case name), and the cases only ``old`` had."""
    before = {c["case"]: c for c in old.get("cases", [])}
    kept = carried(old)  # the runs before ``new``: its own move is what is judged, never its noise
    out = []
    for case in new.get("cases", []):
        earlier = before.pop(case["case"], None)
        out.append(_new_case(case) if earlier is None else _compare_case(earlier, case, kept))
    out.extend(Change(name, "", 0.0, 0.0, 0.0, 0.0, "gone") for name in before)
    return out


def compare_links(old: dict, new: dict) -> list[Change]:
    """Each link of a ``--network`` run against the same link of an earlier one (by its rate), its cases named
    ``[rate] case``; a link only one run measured is "new" or "gone"."""
    before = {run["network"]: run for run in old.get("network_runs", [])}
    out: list[Change] = []
    for run in new.get("network_runs", []):
        rate = run["network"]
        earlier = before.pop(rate, None)
        changes = compare(earlier, run) if earlier is not None else [_new_case(case) for case in run.get("cases", [])]
        out.extend(replace(c, case=f"[{rate}] {c.case}") for c in changes)
    out.extend(Change(f"[{rate}] {case['case']}", "", 0.0, 0.0, 0.0, 0.0, "gone")
               for rate, run in before.items() for case in run.get("cases", []))
    return out


def _compare_case(old: dict, new: dict, kept: list[dict]) -> Change:
    between, repeats = noise_between_runs(new["case"], kept)
    if new.get("ratio_of") and old.get("ratio_of") and new.get("speed_ratio") and old.get("speed_ratio"):
        ours, base = new["ratio_of"]
        noise = max(_spread(_run_ratios(old)), _spread(_run_ratios(new)), between)
        change = new["speed_ratio"] / old["speed_ratio"] - 1
        return Change(new["case"], f"ratio vs {base}", old["speed_ratio"], new["speed_ratio"], change, noise,
                      _verdict(change, noise), repeats)
    subject = next(iter(new["median_seconds"]))
    if subject not in old.get("median_seconds", {}):
        return _new_case(new)
    old_s, new_s = old["median_seconds"][subject], new["median_seconds"][subject]
    noise = max(_spread(old["runs_seconds"].get(subject, [])), _spread(new["runs_seconds"].get(subject, [])), between)
    change = old_s / new_s - 1
    return Change(new["case"], f"median of {subject}", old_s, new_s, change, noise, _verdict(change, noise),
                  repeats)


def _new_case(case: dict) -> Change:
    value = case.get("speed_ratio") or next(iter(case["median_seconds"].values()))
    return Change(case["case"], "", 0.0, value, 0.0, 0.0, "new")


def _run_ratios(case: dict) -> list[float]:
    """Baseline time over ours, run by run (the contenders ran alternately, so run i shared the machine)."""
    ours, base = case["ratio_of"]
    runs = case.get("runs_seconds", {})
    return [b / a for a, b in zip(runs.get(ours, []), runs.get(base, [])) if a > 0]


def _spread(values: Sequence[float]) -> float:
    """Interquartile range over the median: how far repeated runs of one thing lie apart."""
    if len(values) < 4:
        return 0.0
    q1, _q2, q3 = statistics.quantiles(values, n=4)
    middle = statistics.median(values)
    return (q3 - q1) / middle if middle else 0.0


def _verdict(change: float, noise: float) -> str:
    bound = max(noise, FLOOR)
    if change < -bound:
        return "slower"
    if change > bound:
        return "faster"
    return "same"


def any_slower(changes: Sequence[Change]) -> bool:
    return any(c.verdict == "slower" for c in changes)


def render_comparison(changes: Sequence[Change], old_label: str) -> None:
    """A table: each case's figure then and now, the change and the noise it is judged against."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"against {old_label} (change beyond the noise, within the two runs or between kept runs of one "
                    f"code, at least {FLOOR:.0%}, is flagged)")
    for col in ("case", "measure", "before", "now", "change", "noise", "verdict"):
        t.add_column(col)
    colour = {"slower": "red", "faster": "green"}
    for c in changes:
        if c.verdict in ("new", "gone"):
            t.add_row(escape(c.case), c.measure, "", _figure(c.measure, c.new) if c.verdict == "new" else "", "", "",
                      c.verdict)
            continue
        verdict = f"[{colour[c.verdict]}]{c.verdict}[/]" if c.verdict in colour else c.verdict
        t.add_row(escape(c.case), c.measure, _figure(c.measure, c.old), _figure(c.measure, c.new), f"{c.change:+.0%}",
                  _noise(c), verdict)
    Console(width=max(Console().width, 160)).print(t)


def _noise(change: Change) -> str:
    """The noise a change was judged against, and where it was measured when between runs."""
    return f"±{change.noise:.0%}" + (f" ({change.repeats} runs of one code)" if change.repeats else "")


def _figure(measure: str, value: float) -> str:
    return f"{value * 1e3:,.2f} ms" if measure.startswith("median") else f"{value:.2f}x"


def markdown(changes: Sequence[Change]) -> str:
    """The comparison as a Markdown table, for docs/benchmarks.md."""
    lines = ["| case | measure | before | now | change | noise | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in changes:
        if c.verdict in ("new", "gone"):
            lines.append(f"| {c.case} | {c.measure} | | {_figure(c.measure, c.new) if c.verdict == 'new' else ''} | | "
                         f"| {c.verdict} |")
        else:
            lines.append(f"| {c.case} | {c.measure} | {_figure(c.measure, c.old)} | {_figure(c.measure, c.new)} | "
                         f"{c.change:+.0%} | {_noise(c)} | {c.verdict} |")
    return "\n".join(lines) + "\n"
