"""The commit-msg hook the README's set-up turns on: a subject of at most 72 characters, then a blank line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


def run_hook(tmp_path: Path, message: str) -> subprocess.CompletedProcess:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(["bash", str(HOOK), str(path)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("message", ["catalog: leases that always recover\n",
                                     "catalog: a subject of exactly seventy-two characters, counted with care!\n\nbody",
                                     "# a comment git adds\nquery: one table\n\nThe story, as long as it needs.\n"])
def test_a_short_subject_then_a_blank_line_is_taken(tmp_path, message):
    assert run_hook(tmp_path, message).returncode == 0


@pytest.mark.parametrize("message, said", [("x" * 73 + "\n", "73 characters"), ("\n\nbody\n", "empty"),
                                           ("catalog: subject\nstory on the second line\n", "blank")])
def test_a_long_or_empty_subject_or_no_blank_line_is_refused_saying_why(tmp_path, message, said):
    done = run_hook(tmp_path, message)
    assert done.returncode == 1 and said in done.stderr


def test_the_readme_set_up_turns_the_hook_on():
    readme = (HOOK.parents[1] / "README.md").read_text()
    assert "git config core.hooksPath .githooks" in readme
