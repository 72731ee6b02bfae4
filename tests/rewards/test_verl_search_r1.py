"""The Search-R1 exact-match reward against upstream verl 0.9.1's own (`default_compute_score` for the
`searchR1_*` data sources: `search_r1_like_qa_em`).

verl runs in its side venv (VERL_SIDE_PYTHON, built by tests/verl_side.sh) as a subprocess that scores a list
of (response, targets) cases; verl-npu's `default_compute_score` must give the same scores. The cases are
hand-written edge cases plus seeded random responses built from answer fragments, articles, punctuation and
answer tags.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from run_helpers import verl_side_python

from verl_npu.rewards import default_compute_score

pytestmark = pytest.mark.verl_side
VERL_PY = verl_side_python()

SCRIPT = r"""
import contextlib, io, json, sys
from verl.utils.reward_score import default_compute_score

cases = json.loads(sys.stdin.read())
scores = []
for source, response, targets in cases:
    with contextlib.redirect_stdout(io.StringIO()):   # verl prints one case in 64 at random
        scores.append(float(default_compute_score(source, response, {"target": targets})))
print(json.dumps(scores))
"""

HAND = [
    ("searchR1_nq", "<answer> Beijing </answer>", ["beijing"]),
    ("searchR1_hotpotqa", "<answer>The Beijing!</answer>", ["Beijing"]),
    ("searchR1_nq", "<answer>Paris</answer><answer>Beijing</answer>", ["Beijing"]),
    ("searchR1_nq", "no tags Beijing", ["Beijing"]),
    ("searchR1_musique", "<answer>x</answer>" * 11 + "<answer>Beijing</answer>", ["Beijing"]),
    ("searchR1_bamboogle", "<answer>an  apple, a day</answer>", ["apple day"]),
    ("searchR1_triviaqa", "<answer>\nmulti\nline\n</answer>", ["multi line"]),
    ("searchR1_popqa", "<answer></answer>", [""]),
    ("searchR1_2wikimultihopqa", "<answer>Kyoto</answer>", ["Tokyo", "kyoto."]),
]


def random_cases(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    words = ["the", "a", "an", "Paris", "paris", "New", "York", "U.S.", "1999", "!", ",", "Ab-c"]
    cases = []
    for _ in range(n):
        answer = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        tags = rng.choice(["<answer>{}</answer>", "<answer> {} </answer>", "{}", "<answer>{}"])
        response = "think " + tags.format(answer) * rng.choice([1, 1, 2, 12])
        targets = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.4:
            targets.append(answer)
        cases.append(("searchR1_nq", response, targets))
    return cases


def test_scores_match_verls_search_r1_like_qa_em():
    cases = HAND + random_cases(300)
    proc = subprocess.run([VERL_PY, "-c", SCRIPT], input=json.dumps(cases), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verl = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [default_compute_score(s, r, {"target": t}) for s, r, t in cases]
    assert ours == verl
    assert 0 < sum(v == 1.0 for v in verl) < len(cases)  # the cases reach both outcomes
