"""`flightpart bench --compare`: a run against an earlier one, judged against the noise measured in both."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flightpart.bench.compare import FLOOR, any_slower, compare, markdown
from flightpart.bench.history import KEPT, carried, code_digest, entry, stamp
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


def test_runs_of_one_code_that_lay_far_apart_widen_the_noise_a_change_is_judged_against():
    """Within each run the ratios are steady, but two whole runs of one code gave 1.0x and 0.8x: a third run of
    other code at 0.85x is inside that noise, not a slowdown; without the kept runs it would be flagged."""
    first = {**run(case("read", STEADY, STEADY)), "code": "a"}
    again = {**run(case("read", [t / 0.8 for t in STEADY], STEADY)), "code": "a"}
    kept = {**again, "history": carried(first)}
    changed = {**run(case("read", [t / 0.85 for t in STEADY], STEADY)), "code": "b"}
    (judged,) = compare(kept, changed)
    assert judged.verdict == "same" and judged.noise == pytest.approx(0.25) and judged.repeats == 2
    assert "(2 runs of one code)" in markdown([judged])
    (alone,) = compare(again, {**changed, "code": "a2"})
    assert alone.verdict == "faster" and alone.repeats == 0


def test_runs_of_different_code_are_never_taken_for_noise():
    """A real slowdown between two codes must not pass for noise just because both runs were kept."""
    kept = {**run(case("read", [t / 0.5 for t in STEADY], STEADY)), "code": "b",
            "history": carried({**run(case("read", STEADY, STEADY)), "code": "a"})}
    (judged,) = compare(kept, {**run(case("read", [t / 0.25 for t in STEADY], STEADY)), "code": "c"})
    assert judged.verdict == "slower" and judged.repeats == 0


def test_a_saved_run_carries_the_runs_kept_before_it_and_names_its_code(tmp_path):
    old, new, saved = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "saved.json"
    old.write_text(json.dumps({**run(case("read", STEADY, STEADY)), "code": "a",
                               "history": [entry({**run(case("read", STEADY, STEADY)), "code": f"c{i}"})
                                           for i in range(KEPT)]}))
    new.write_text(json.dumps(run(case("read", STEADY, STEADY))))
    result = CliRunner().invoke(main, ["bench", "--from-json", str(new), "--compare", str(old), "--json", str(saved)])
    assert result.exit_code == 0, result.output
    history = json.loads(saved.read_text())["history"]
    assert len(history) == KEPT and history[-1]["code"] == "a" and history[0]["code"] == "c1"
    assert history[-1]["figures"] == {"read": pytest.approx(1.0)}
    assert stamp({})["code"] == code_digest() != ""


def test_the_digest_follows_the_measured_code_not_how_runs_are_compared(tmp_path, monkeypatch):
    """Editing the comparison leaves a run's code as it was; editing what is measured names new code."""
    import flightpart.bench.history as history

    root = tmp_path / "pkg"
    (root / "bench").mkdir(parents=True)
    (root / "reader.py").write_text("x = 1\n")
    (root / "bench" / "compare.py").write_text("y = 1\n")
    monkeypatch.setattr(history, "_PACKAGES", ("pkg",))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = code_digest()
    (root / "bench" / "compare.py").write_text("y = 2\n")
    assert code_digest() == before
    (root / "reader.py").write_text("x = 2\n")
    assert code_digest() != before


def test_a_run_is_never_its_own_noise_and_runs_of_another_size_are_not_mixed():
    """Two runs of one code compared: the move between them is what is judged, so it cannot also be the noise
    (it would excuse itself); a quick run and a full run of one code differ by their size, not by noise."""
    old = {**run(case("read", STEADY, STEADY)), "code": "a"}
    new = {**run(case("read", [t / 0.5 for t in STEADY], STEADY)), "code": "a"}
    (judged,) = compare(old, new)
    assert judged.verdict == "slower" and judged.repeats == 0
    full = {**run(case("open", STEADY)), "code": "a", "size_bytes": 1 << 30, "quick": False}
    quick = {**run(case("open", [t / 16 for t in STEADY])), "code": "a"}
    kept = {**full, "history": carried(quick)}
    (opened,) = compare(kept, {**run(case("open", [t * 2 for t in STEADY])), "code": "b", "size_bytes": 1 << 30,
                               "quick": False})
    assert opened.verdict == "slower" and opened.repeats == 0


def test_a_saved_run_whose_history_is_not_a_list_of_runs_is_compared_without_it(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({**run(case("read", STEADY, STEADY)), "history": 5}))
    new.write_text(json.dumps(run(case("read", STEADY, STEADY))))
    result = CliRunner().invoke(main, ["bench", "--from-json", str(new), "--compare", str(old)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert carried({"history": [1, {"figures": "x"}, {"code": "c", "figures": {}}]})[0]["code"] == "c"


def links(**runs: dict) -> dict:
    """A saved ``--network`` run: one run of cases per link rate."""
    return {"network_runs": [{**r, "network": rate} for rate, r in runs.items()]}


def test_a_network_run_is_compared_link_by_link_and_written_as_markdown(tmp_path):
    old, new, md = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "net.md"
    old.write_text(json.dumps(links(loopback=run(case("read", STEADY, STEADY)),
                                    **{"10gbit": run(case("read", STEADY, STEADY)),
                                       "1gbit": run(case("read", STEADY, STEADY))})))
    new.write_text(json.dumps(links(loopback=run(case("read", STEADY, STEADY)),
                                    **{"10gbit": run(case("read", [2 * t for t in STEADY], STEADY))})))
    result = CliRunner().invoke(main, ["bench", "--network", "loopback", "--from-json", str(new), "--compare", str(old),
                                       "--markdown", str(md)], terminal_width=200)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 6}
    assert "same" in rows["[loopback] read"] and "slower" in rows["[10gbit] read"] and "gone" in rows["[1gbit] read"]
    text = md.read_text()
    assert "#### loopback" in text and "#### 10gbit" in text and "| [10gbit] read |" in text
    strict = CliRunner().invoke(main, ["bench", "--network", "x", "--from-json", str(new), "--compare", str(old),
                                       "--strict"])
    assert strict.exit_code == 1
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(run(case("read", STEADY, STEADY))))
    wrong = CliRunner().invoke(main, ["bench", "--network", "x", "--from-json", str(new), "--compare", str(plain)])
    assert wrong.exit_code == 2 and "not a --network bench run" in wrong.output


def test_options_that_would_be_ignored_are_usage_errors(tmp_path):
    saved = Path(__file__).resolve().parents[2] / "docs" / "img" / "scale.json"
    for extra in (["--compare", str(saved)], ["--markdown", str(tmp_path / "s.md")]):
        result = CliRunner().invoke(main, ["bench", "--scale", "--from-json", str(saved), *extra])
        assert result.exit_code == 2 and "--scale" in result.output and not (tmp_path / "s.md").exists()
    alone = CliRunner().invoke(main, ["bench", "--from-json", str(saved), "--strict"])
    assert alone.exit_code == 2 and "--compare" in alone.output


@pytest.mark.parametrize("runs", [[1], [{"cases": []}], [{"network": ["x"], "cases": []}],
                                  [{"network": "a", "cases": []}, {"network": "a", "cases": []}]],
                         ids=["not a run", "no link", "a link that is no name", "a link twice"])
def test_a_network_file_with_malformed_runs_is_a_usage_error_before_anything_runs(tmp_path, runs):
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(json.dumps({"network_runs": runs}))
    good.write_text(json.dumps(links(loopback=run(case("read", STEADY, STEADY)))))
    for args in (["--from-json", str(good), "--compare", str(bad)], ["--from-json", str(bad)]):
        result = CliRunner().invoke(main, ["bench", "--network", "x", *args])
        assert result.exit_code == 2 and "not a --network bench run" in result.output, result.output
