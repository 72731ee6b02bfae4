"""The README's quick start, walked through as a newcomer does it (issue 27): its command, run from a
copy of the repository, prints a summary that shows the demo learned and where its outputs are.

CI installs the project from a clean clone exactly as README.md says before it runs the tests, so
the install half of the quick-start command (`python3 -m venv .venv && .venv/bin/pip install -e .`) is
exercised there; here the copy gets that same venv (a link named .venv, which launch/run_recipe.sh
picks up as the README's venv) and the rest of the command runs exactly as written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e . && "


def _quick_start_command() -> str:
    """The one command of README's "Quick start" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S)
    assert block, "README's Quick start has no bash block"
    lines = [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert len(lines) == 1, lines
    return lines[0]


def _copy_of_the_repo(dest: Path) -> None:
    """The files a clone has (tracked, and new files not ignored): no outputs, data or venvs of this checkout."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.mark.slow
def test_readme_quick_start_learns_and_says_where_everything_is(tmp_path):
    command = _quick_start_command()
    assert command.startswith(INSTALL), command
    run = command.removeprefix(INSTALL)
    assert run == "bash launch/run_recipe.sh tiny_geo3k", run
    clone = tmp_path / "verl-npu"
    _copy_of_the_repo(clone)
    (clone / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_NPU_PYTHON", "PYTHONPATH", "RAY_ADDRESS")}
    proc = subprocess.run(["bash", "-c", run], cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    shown = re.search(r"summary of the run in (\S+):", out)
    assert shown, out[-4000:]
    summary = out[shown.start():]
    printed = shown.group(1)  # as the run names its folder (relative to where it was started, or absolute)
    outputs = clone / printed
    assert outputs.resolve() == (clone / "outputs" / "tiny_geo3k").resolve(), printed
    m = re.search(r"mean reward \(critic/score/mean\): first 10 steps ([0-9.]+) -> last 10 steps ([0-9.]+)", summary)
    assert m, summary
    first, last = map(float, m.groups())
    assert first < 0.1 and last >= 0.9, summary  # README: 0.006-0.017 -> 0.996-1.000 over its recorded seeds
    acc = re.search(r"validation \(synthetic_geometry, step 300\): reward [0-9.]+, accuracy ([0-9.]+)", summary)
    assert acc and float(acc.group(1)) >= 0.9, summary
    assert "a policy that ignores the picture scores at most 0.250 (synthetic_geometry)" in summary
    assert f"training curves: {Path(printed) / 'training_curves.png'}" in summary
    assert (outputs / "training_curves.png").stat().st_size > 10_000
    assert f"tensorboard --logdir {Path(printed) / 'tensorboard'}" in summary
    assert list((outputs / "tensorboard").rglob("events.out.tfevents.*"))
    assert (clone / "data" / "tiny_geo3k" / "train.parquet").is_file()  # made on the first run, as README says
