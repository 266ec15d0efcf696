"""`flightpart bench --compare`: a run against an earlier one, judged against the noise measured in both."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flightpart.bench.compare import FLOOR, any_slower, compare, markdown
from flightpart.cli import main


def case(name: str, ours: list[float], base: list[float] | None = None) -> dict:
    times = {"flightpart x": ours, **({"raw x": base} if base else {})}
    medians = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    return {"case": name, "goal": "", "bytes": 1, "met": None, "median_seconds": medians, "runs_seconds": times,
            "throughput_gbps": {}, "speed_ratio": medians["raw x"] / medians["flightpart x"] if base else None,
            "ratio_of": ["flightpart x", "raw x"] if base else None}


def run(*cases: dict) -> dict:
    return {"size_bytes": 1 << 20, "quick": True, "runs": 5, "seconds": 1.0,
            "machine": {"cpus": 2, "memory_bytes": 1, "python": "3", "pyarrow": "26"}, "cases": list(cases)}


STEADY = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0]


def test_a_run_against_itself_is_the_same_everywhere():
    r = run(case("read", STEADY, STEADY), case("open", STEADY))
    assert [c.verdict for c in compare(r, copy.deepcopy(r))] == ["same", "same"]


def test_flightpart_twice_as_slow_against_an_unchanged_baseline_is_flagged():
    old = run(case("read", STEADY, STEADY))
    new = run(case("read", [2 * t for t in STEADY], STEADY))
    (change,) = compare(old, new)
    assert change.verdict == "slower" and change.change == pytest.approx(-0.5, abs=0.02)
    assert any_slower([change])


def test_a_machine_twice_as_slow_for_both_contenders_is_not_a_regression():
    old = run(case("read", STEADY, STEADY))
    new = run(case("read", [2 * t for t in STEADY], [2 * t for t in STEADY]))
    assert compare(old, new)[0].verdict == "same"


def test_a_change_within_the_measured_noise_is_not_flagged_but_beyond_it_is():
    noisy = [1.0, 1.3, 0.8, 1.1, 0.7, 1.25, 0.9]
    old = run(case("read", noisy, STEADY))
    slightly = run(case("read", [t * 1.1 for t in noisy], STEADY))
    (change,) = compare(old, slightly)
    assert change.noise > 0.1 and change.verdict == "same"
    much = run(case("read", [t * 3 for t in noisy], STEADY))
    assert compare(old, much)[0].verdict == "slower"


def test_even_steady_runs_need_the_floor_before_a_change_counts():
    old = run(case("read", [1.0] * 7, [1.0] * 7))
    assert compare(old, run(case("read", [1.0 / (1 - FLOOR / 2)] * 7, [1.0] * 7)))[0].verdict == "same"
    assert compare(old, run(case("read", [0.5] * 7, [1.0] * 7)))[0].verdict == "faster"


def test_a_case_without_a_baseline_is_compared_on_its_own_median():
    old = run(case("open", STEADY))
    (change,) = compare(old, run(case("open", [3 * t for t in STEADY])))
    assert change.measure.startswith("median") and change.verdict == "slower"


def test_new_and_gone_cases_are_named_not_compared():
    changes = compare(run(case("old only", STEADY, STEADY)), run(case("new only", STEADY, STEADY)))
    assert {(c.case, c.verdict) for c in changes} == {("new only", "new"), ("old only", "gone")}
    assert "| new only |" in markdown(changes) and "| old only |" in markdown(changes)


def test_the_cli_compares_saved_runs_and_strict_exits_1_on_a_slowdown(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(run(case("read", STEADY, STEADY))))
    new.write_text(json.dumps(run(case("read", [2 * t for t in STEADY], STEADY))))
    md = tmp_path / "bench.md"
    result = CliRunner().invoke(main, ["bench", "--from-json", str(new), "--compare", str(old), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    assert "slower" in result.output and "| read | flightpart x |" in md.read_text() and "slower" in md.read_text()
    strict = CliRunner().invoke(main, ["bench", "--from-json", str(new), "--compare", str(old), "--strict"])
    assert strict.exit_code == 1
    same = CliRunner().invoke(main, ["bench", "--from-json", str(old), "--compare", str(old), "--strict"])
    assert same.exit_code == 0, same.output


def test_a_file_that_is_not_a_saved_run_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"cases\": 3}")
    result = CliRunner().invoke(main, ["bench", "--from-json", str(bad)])
    assert result.exit_code == 2 and "not a bench run" in result.output


def test_a_cpu_ratio_against_a_baseline_that_spent_no_measurable_cpu_is_unknown_not_an_error():
    """/proc counts CPU in 10 ms ticks: a short baseline run can show none (the network bench's quick runs did)."""
    from flightpart.bench.measure import Case

    case = Case("remote", "goal", 1 << 20, {"ours": [0.1], "raw": [0.1]}, cpu={"ours": [0.01], "raw": [0.0]})
    case.ratio = ("ours", "raw")
    assert case.cpu_ratio() is None and case.as_json()["cpu_ratio"] is None
    case.cpu["raw"] = [0.02]
    assert case.cpu_ratio() == 0.5


def test_a_saved_scale_run_is_shown_and_drawn_again_not_run(tmp_path):
    saved = Path(__file__).resolve().parents[2] / "docs" / "img" / "scale.json"
    png = tmp_path / "scale.png"
    result = CliRunner().invoke(main, ["bench", "--scale", "--from-json", str(saved), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "goal" in result.output and "running:" not in result.output and png.stat().st_size > 0
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(run(case("read", STEADY, STEADY))))
    wrong = CliRunner().invoke(main, ["bench", "--scale", "--from-json", str(plain)])
    assert wrong.exit_code == 2 and "not a --scale bench run" in wrong.output
