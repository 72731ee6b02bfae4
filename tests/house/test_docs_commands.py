"""Every shell command the docs quote works as written.

Where commands are found: README.md, docs/*.md, bench/results/*.md and the recipes' headers (the rules are in
tests/helpers/doc_commands_extract.py's module doc).

How each is checked (nothing trains, nothing downloads; every file is written under tmp_path; the
commands of one file run in order in one folder, so a `verl-npu cp` makes the file that the
next line validates):
- `python data_prep/X.py ...`: the script exists; it runs with the quoted flags plus --dry-run;
  then, in --synthetic form (N capped at 16) or --local-dataset-path form (against a small
  fixture in the source format), it runs for real into a temporary folder and must write
  train.parquet and test.parquet. Save folders are always redirected to the temporary folder.
- `verl-npu VERB ...` (and `python -m verl_npu.cli ...`): the verb and its flags parse (the
  real argparse parser); list, cp, validate, show and explain run; `run` is validated like
  `verl-npu run` does before it trains (load_recipe, whose rules include the trainer's refusals), never trained.
  EDIT_ME fields the command does not set are filled (the recipe header says to edit them).
- `bash launch/run_recipe.sh ...`: the launcher runs with a stand-in Python that records the
  command the launcher would exec (it must be `-m verl_npu.cli run` with the quoted arguments);
  that command is then checked as above (its preflight).
- Usage synopses (`[--out DIR]`, `NAME|PATH`, `RECIPE`, `...`): the flags they name exist; a
  lone recipe placeholder is replaced by each shipped recipe until one validates.
- Anything that cannot run here is checked in part, by an entry of ALLOWED_PARTIAL with its
  reason (tests/helpers/doc_commands_extract.py; every entry must still be used). A command no checker knows fails.

Keep it fast: everything runs in this process except the launcher (bash) and bench scripts'
--help (subprocesses, a second or two each).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands_check import Context, check_file
from doc_commands_extract import ALLOWED_PARTIAL, REPO, commands_of, doc_sources

SOURCES = doc_sources()


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[Path, tuple[list[str], Context]]:
    """Every source checked once (the per-file tests and the allow-list test share the results)."""
    return {path: check_file(path, tmp_path_factory.mktemp("docs")) for path in SOURCES}


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(REPO)) for p in SOURCES])
def test_every_quoted_command_works(path, checked):
    failures, _ = checked[path]
    assert not failures, "commands quoted in the docs that do not work:\n" + "\n".join(failures)


def test_the_commands_are_found():
    """The extraction sees what a reader sees (a silently empty extraction would pass everything)."""
    readme = [c.text for c in commands_of(REPO / "README.md")]
    assert "bash launch/run_recipe.sh tiny_geo3k" in " ".join(readme)
    assert any(t.startswith(".venv/bin/python data_prep/gsm8k.py --synthetic") for t in readme)
    assert any(t.endswith("&& bash tests/vllm_cpu.sh && bash tests/verl_side.sh") for t in readme)
    assert sum(t.startswith(".venv/bin/verl-npu ") for t in readme) >= 6
    for recipe in sorted((REPO / "recipes").rglob("*.yaml")):
        run = [c for c in commands_of(recipe) if c.strict]
        assert any("launch/run_recipe.sh" in c.text for c in run), f"{recipe.name}: no Run command found"
    formats = [c.text for c in commands_of(REPO / "docs" / "data_formats.md")]
    assert any(t.startswith("python data_prep/gsm8k.py") for t in formats)


def test_allow_list_entries_are_explained_and_used(checked):
    used = {key for _, ctx in checked.values() for key in ctx.partial}
    for key, reason in ALLOWED_PARTIAL.items():
        assert len(reason) > 20, f"ALLOWED_PARTIAL[{key!r}] needs a reason"
    assert set(ALLOWED_PARTIAL) <= used, f"unused ALLOWED_PARTIAL entries: {set(ALLOWED_PARTIAL) - used}"


BROKEN = [
    ("python data_prep/geo3k_data.py --local-save-dir x", "does not exist"),
    ("python data_prep/gsm8k.py --local-save-dir x --bogus", "--dry-run failed"),
    ("python data_prep/gsm8k.py --synthetic many", "--dry-run failed"),
    ("verl-npu valdate tiny_geo3k", "no verb"),
    ("verl-npu validate tiny_geo3k data.no_such_key=1", "exit 1"),
    ("verl-npu validate tiny_geo3k --check-path", "no option --check-path"),
    ("verl-npu run qwen25vl_geo3k actor_rollout_ref.rollout.n=1", "does not validate"),
    ("verl-npu doctor --rollout sglang", "does not parse"),
    ("verl-npu doctor [--device cpu|tpu]", "not its choices"),
    ("bash launch/run_recipe.sh no_such_recipe", "no recipe named"),
    ("bash launch/run_recipe.sh tiny_geo3k data.train_batch_size=seven", "does not validate"),
    ("bash launch/no_such.sh", "does not exist"),
    (".venv/bin/pip install -e '.[nope]'", "no extra 'nope'"),
    ("python bench/no_such_bench.py", "does not exist"),
    ("python -m pytest -m gpu tests/cli/test_cli.py", "marker 'gpu'"),
    ("python -m pytest tests/test_nothing_here.py", "no such test file"),
    ("python -m verl_npu.cluster preflight --nodes FILE RECIPE", "no option --nodes"),
    ("python -m verl_npu.nothing", "no check for python -m"),
    ("source launch/nothing.sh", "no such file"),
    (".venv-verl/bin/python -m verl.model_merger merge --backend fsdp --hf_upload_path x", "--hf_upload_path"),
    ("python -m verl.trainer.main_ppo trainer.no_such_key=1", "not a key=value override"),
]


@pytest.mark.parametrize("text, expected", BROKEN, ids=[t for t, _ in BROKEN])
def test_a_broken_command_fails(text, expected, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"Run this:\n```bash\n{text}\n```\nand `{text}` too.\n")
    failures, _ = check_file(doc, tmp_path / "run")
    assert len(failures) == 2, failures
    assert all(expected in f for f in failures), failures


def test_an_unknown_command_in_a_shell_block_fails_but_prose_is_ignored(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```bash\nfrobnicate --all\n```\n`ray status` and `frobnicate` are prose.\n```\naf_output_dir/\n  logs/\n```\n"
    )
    failures, _ = check_file(doc, tmp_path / "run")
    assert len(failures) == 1 and "frobnicate --all" in failures[0] and "not a command" in failures[0]


def test_recipe_header_run_block_is_read(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "# A recipe.\n# Trains: x (`python data_prep/gsm8k.py --synthetic N`)\n"
        "# Run:\n#   verl-npu cp qwen25_gsm8k mine.yaml     # then edit\n"
        "#   bash launch/run_recipe.sh mine.yaml \\\n#       trainer.total_epochs=1\n"
        "#   (prose in parentheses is skipped)\n# Expect: y\naf_output_dir: x\n"
    )
    cmds = commands_of(recipe)
    assert [(c.text, c.strict) for c in cmds] == [
        ("verl-npu cp qwen25_gsm8k mine.yaml     # then edit", True),
        ("bash launch/run_recipe.sh mine.yaml  trainer.total_epochs=1", True),
        ("python data_prep/gsm8k.py --synthetic N", False),
    ]
    failures, _ = check_file(recipe, tmp_path / "run")
    assert failures == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("# Run:\n#   python data_prep/geo3k_x.py --local_save_dir ~/data/geo3k\n# Expect: y\n")
    failures, _ = check_file(bad, tmp_path / "run2")
    assert len(failures) == 1 and "does not exist" in failures[0]


def test_show_output_ends_with_a_newline():
    """`verl-npu show` as a user runs it: the next prompt starts on its own line."""
    proc = subprocess.run(
        [sys.executable, "-m", "verl_npu.cli", "show", "tiny_geo3k"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and not proc.stdout.endswith("\n\n")
    assert proc.stdout.splitlines()[-1].startswith("  ")  # the last line is the YAML's, not a blank one
