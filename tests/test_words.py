"""The project's text speaks to users: no sentence about how the project was developed.

Docs, README, docstrings, comments and benchmark output say what the software does and how to
use it; how it came to be belongs in CHANGELOG.md (not scanned). The check reads every tracked
text file and fails on wording that refers to the project's history: commit hashes, issue
numbers, work sessions, "the issue", the documents it was specified from ("the seeds"), "anchor", and
comparisons with earlier versions ("now", "no longer", "as before", "its earlier name").

Allow-list (kept small; each entry says why it is legitimate):

* ``now`` as a name in code (``now = ...``, ``clock::now()``, ``(now - start)``, ``self.now``):
  the current time.
* ``now`` in the phrases of ``_NOW_AT_RUN_TIME``: the present moment of a run (a node that
  "communicates now", a buffer allocated at its first use "rather than now"), not a comparison
  with an earlier version of ExoGym.
* ``seeds`` as random seeds ("equal parts give equal seeds", "node ``r`` seeds torch"): only
  the phrases that name the specification documents are hits.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUFFIXES = (".py", ".md", ".toml", ".txt", ".cpp", ".cu", ".h")
#: CHANGELOG.md is history's own place (Keep a Changelog); this file holds the examples the check
#: must find.
NOT_SCANNED = {"CHANGELOG.md", "tests/test_words.py"}

_ORDINAL = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|previous|last|next|this|that)"

#: (name, pattern) of history wording; each is matched case-insensitively.
HISTORY = [
    ("commit hash", r"(?<![\w./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])"),
    ("commit reference", r"\bcommit [0-9a-f]{7,40}\b"),
    ("issue reference", r"\b(?:issue|pr|pull request)\s*#?\d+\b|(?<![\w&#/])#\d+\b"),
    (
        "the seeds",
        r"\bseeds'|\b(?:in|of|from) the seeds\b|\bthe seeds (?:use|describe|say)\b|shared/seeds"
        r"|seed's (?:other )?spelling",
    ),
    ("anchor", r"\banchor"),
    ("the issue", r"\b(?:the|this|that) issue\b(?! tracker)|\bthe issue's\b"),
    ("work session", rf"\b{_ORDINAL}(?:\s+\w+)?\s+sessions?\b|\bsession (?:started|began)\b"),
    (
        "development machine",
        r"\bthis project'?s (?:[\w-]+ )*machine\b|\bthis project'?s (?:\d+ )?CPU cores\b|\bCI machine\b",
    ),
    ("no longer", r"\bno longer\b"),
    ("as before", r"\bas before\b"),
    ("earlier version", r"\b(?:its|an?|the) (?:earlier|former|old|previous) (?:name|version|spelling)\b"),
    ("now", r"\bnow\b"),
    ("what an earlier version measured", r"\bgrew (?:by\b|\d)|\b(?:once|each) took\b"),
]

#: Uses of ``now`` in code: a variable or a clock's current time.
_NOW_IN_CODE = re.compile(
    r"(?:\.|::)now\(|\.now\b|\bdef now\(|^\s*now: |\(now\b|\bnow\s*(?:==?|[<>+)]|-(?!-))|\breturn now\b",
    re.IGNORECASE,
)

#: Phrases where ``now`` is the present moment of a run.
_NOW_AT_RUN_TIME = re.compile(
    r"rather than now|now and then|exists now|made now|part now|rejoin now|started now|starts now"
    r"|begins now|now, the node idle|communicates now|peak now|by now|say now|now, and return|on ``device`` now",
    re.IGNORECASE,
)


def hits_in(text: str, path: str) -> list[str]:
    """``path:line: kind: line`` for every line of ``text`` with history wording."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for kind, pattern in HISTORY:
            for m in re.finditer(pattern, line, re.IGNORECASE):
                if kind == "now":
                    window = line[max(0, m.start() - 30) : m.end() + 30]
                    if _NOW_IN_CODE.search(line[max(0, m.start() - 8) : m.end() + 3]) or _NOW_AT_RUN_TIME.search(
                        window
                    ):
                        continue
                found.append(f"{path}:{number}: {kind}: {line.strip()}")
                break
    return found


def scanned_files(root: str) -> list[str]:
    """The tracked text files the check reads, relative to ``root``."""
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [p for p in listed.splitlines() if p.endswith(SUFFIXES) and p not in NOT_SCANNED]


def history_wording(root: str) -> list[str]:
    out = []
    for path in scanned_files(root):
        full = os.path.join(root, path)
        if os.path.exists(full):
            with open(full, encoding="utf-8", errors="replace") as f:
                out += hits_in(f.read(), path)
    return out


def test_no_tracked_text_file_speaks_of_the_projects_history() -> None:
    hits = history_wording(ROOT)
    assert not hits, "reword for users (history goes in CHANGELOG.md):\n" + "\n".join(hits)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to list the tracked files")
def test_a_planted_commit_reference_fails_the_check(tmp_path) -> None:
    """A copy of the tree with "fixed in commit 1166632" added to a tracked file has a hit there."""
    for path in scanned_files(ROOT):
        if os.path.exists(os.path.join(ROOT, path)):
            os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
            shutil.copy(os.path.join(ROOT, path), tmp_path / path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    with open(tmp_path / "exogym" / "__init__.py", "a") as f:
        f.write("# The hang was fixed in commit 1166632.\n")
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    hits = history_wording(str(tmp_path))
    assert any(h.startswith("exogym/__init__.py:") and "1166632" in h for h in hits), hits


@pytest.mark.parametrize(
    "sentence",
    [
        "See issue #12 for the details.",
        "The fix (#12) made it faster.",
        "As the seeds describe, clients are sampled.",
        "Figures of the sixth session.",
        "In the fifth work session we measured it.",
        "Measured on this project's machine.",
        "19 s on this project's 2-core machine.",
        "It no longer copies the model.",
        "The buffer is kept as before.",
        "The same class under its earlier name.",
        "The cache now holds 64 rounds.",
        "The anchor's measure.",
        "As measured on the work the issue names.",
        "Between 321f9b0 and f6ab048 it grew.",
        "(the soak's workers grew by them until every client had been sampled)",
        "(a worker of 500 nodes grew 2 MB a round)",
        "0.7 GB per worker where a copy each took 1.1 GB.",
    ],
)
def test_each_kind_of_history_wording_is_found(sentence: str) -> None:
    assert hits_in(sentence, "x.md"), sentence


@pytest.mark.parametrize(
    "line",
    [
        "const auto now = std::chrono::steady_clock::now();",
        "if (now > deadline) return -2;",
        "now = peak = 0",
        '"""A step (or a span of steps) begins now."""',
        "torch.manual_seed(seed)  # random seeds per node",
        "Equal parts give equal seeds; node r seeds torch with it.",
        "## Install  <!-- the #install link -->",
    ],
)
def test_allowed_uses_are_not_hits(line: str) -> None:
    assert not hits_in(line, "x.py"), line
