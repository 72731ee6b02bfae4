"""Checking the shell commands the docs quote, one by one (the rules are in tests/house/test_docs_commands.py's
module doc; doc_commands_extract.py finds the commands)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib


from doc_commands_extract import (
    ALLOWED_PARTIAL,
    ENV_ASSIGN,
    PIP,
    PLACEHOLDER,
    PYTHON,
    REPO,
    SUPPLY,
    Command,
    commands_of,
    looks_like_command,
    shell_tokens,
)


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
    """The simple commands of a line (split on &&, ; and a background &), each as tokens."""
    parts: list[list[str]] = [[]]
    for token in shell_tokens(text):
        if token in ("&&", ";", "&"):
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
    """`python path argv...` in this process: argv and the script's folder first on sys.path, as python sets them."""
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.parent))
    try:
        return _capture(lambda: runpy.run_path(str(path), run_name="__main__"))
    finally:
        sys.argv, sys.path[:] = old_argv, old_path


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
    from verl_npu.config.recipes import find_recipe

    local = ctx.cwd / os.path.expanduser(arg)
    if local.is_file():
        return local
    with _in_dir(ctx.cwd):
        return find_recipe(arg).resolve()


def _filled_overrides(recipe: Path, overrides: list[str], ctx: Context, sft: bool = False) -> list[str]:
    """``overrides`` plus a value for every EDIT_ME field of ``recipe`` they do not set (``sft``: an SFT
    recipe, whose short keys are its own sections')."""
    from verl_npu.config import expand_key
    from verl_npu.config.recipes import placeholder_fields

    def full(key: str) -> str:
        key = key.lstrip("+")
        if not sft:
            return expand_key(key)
        return key if key == "af_output_dir" or key.startswith("backend_config.") else "backend_config." + key

    given = {full(o.split("=", 1)[0]) for o in overrides if "=" in o}
    supply = dict(SUPPLY, af_output_dir=str(ctx.tmp / "af_output_dir"))
    extra = [f"{k}={supply[k]}" for k in placeholder_fields(recipe) if k not in given and k in supply]
    return [*overrides, *extra]


def _validate_for_run(recipe_arg: str, overrides: list[str], ctx: Context) -> None:
    """What `verl-npu run` checks before it trains: the recipe loads and the trainer supports it."""
    from verl_npu.config import load_recipe
    from verl_npu.config.sft import is_sft_recipe, load_sft_recipe
    from verl_npu.config.stages import is_stages_tree, load_stages
    from verl_npu.config.tree import read_yaml_file
    from verl_npu.errors import UserError

    try:
        recipe = _resolve_recipe(recipe_arg, ctx)
        with _in_dir(ctx.cwd):
            if is_stages_tree(read_yaml_file(recipe)):  # SFT then RL: both stages validated
                load_stages(str(recipe), overrides)
                return
            if is_sft_recipe(recipe):  # `run` hands an SFT recipe to `verl-npu sft`
                load_sft_recipe(str(recipe), _filled_overrides(recipe, overrides, ctx, sft=True))
                return
            load_recipe(str(recipe), _filled_overrides(recipe, overrides, ctx))  # trainer refusals included
    except UserError as e:
        raise CommandFailed(f"the recipe does not validate: {e}") from None


def _any_recipe(check) -> None:
    """Run ``check(recipe_name)`` for each shipped recipe until one passes (a RECIPE placeholder)."""
    from verl_npu.config.recipes import list_recipes

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
    if verb == "retrieval-server":
        ctx.allow("server")
        if not synopsis and len(args) > 1:  # `verl-npu retrieval-server` alone is a mention of the verb
            code, _, err = _capture(lambda: parser.parse_args(args))
            if code:
                raise CommandFailed(f"does not parse: {err.strip()}")
        return
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
        if (
            verb in ("validate", "show", "run")
            and placeholders == positional[:1]
            and positional
            and not any(is_synopsis([a]) for a in args[1:] if a not in placeholders)
        ):
            _any_recipe(lambda name: check_verl_npu([verb, name, *args[2:]], ctx, False))
        return
    code, _, err = _capture(lambda: parser.parse_args(args))
    if code:
        if not positional and "required" in err:
            return  # a mention of the verb (`verl-npu show`), not a full command
        raise CommandFailed(f"does not parse: {err.strip()}")
    ns = parser.parse_args(args)
    if verb in ("validate", "show", "plan"):  # a recipe's EDIT_ME fields get stand-in values
        from verl_npu.errors import UserError

        try:
            recipe = _resolve_recipe(ns.recipe, ctx)
        except UserError as e:
            raise CommandFailed(str(e)) from None
        ns.recipe = str(recipe)
        if verb != "plan":  # plan fills them itself, from the placeholders' examples (a model's name gives its shape)
            ns.overrides = _filled_overrides(recipe, ns.overrides, ctx)
    if verb in ("run", "sft"):
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
        table = pa.table(
            {
                "images": pa.array([[{"bytes": buf.getvalue(), "path": None}]] * 2, type=images),
                "problem": ["<image>Find x.", "<image>Find y."],
                "answer": ["3", "4"],
            }
        )
        pq.write_table(table, root / f"{split}-00000-of-00001.parquet")
    return root


def _gsm_fixture(root: Path) -> Path:
    for split in ("train", "test"):
        pq.write_table(
            pa.table(
                {"question": ["What is 2 + 2?", "What is 3 + 1?"], "answer": ["2 + 2 = 4\n#### 4", "3 + 1 = 4\n#### 4"]}
            ),
            root / f"{split}-00000-of-00001.parquet",
        )
    return root


def _search_fixture(root: Path) -> Path:
    for split in ("train", "test"):  # Search-R1's data (PeterJinGo/nq_hotpotqa_train)
        pq.write_table(
            pa.table({"question": ["who wrote hamlet?"], "golden_answers": [["Shakespeare"]], "data_source": ["nq"]}),
            root / f"{split}.parquet",
        )
    return root


FIXTURES = {
    "geometry3k.py": _geo_fixture,
    "geo3k.py": _geo_fixture,
    "gsm8k.py": _gsm_fixture,
    "search_r1.py": _search_fixture,
}
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
        raise CommandFailed(
            f"{script.relative_to(REPO)} does not exist "
            f"(data_prep has: {', '.join(sorted(p.name for p in script.parent.glob('*.py')))})"
        )
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
    proc = subprocess.run(
        ["bash", str(script), *args], cwd=ctx.cwd, env=run_env, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0 or not record.is_file():
        raise CommandFailed(f"the launcher failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    argv = record.read_text().split("\0")[:-1]
    verb, args = ("sft", args[1:]) if args[:1] == ["--sft"] else ("run", args)
    if argv[:3] != ["-m", "verl_npu.cli", verb] or argv[3:] != args:
        raise CommandFailed(f"the launcher would run {argv}, not -m verl_npu.cli {verb} {args}")
    check_verl_npu([verb, *args], ctx, False)


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
        if module in ("verl_npu.config.reference", "verl_npu.config.compat"):  # generated docs
            proc = subprocess.run(
                [sys.executable, "-m", module],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
            )
            if proc.returncode:
                raise CommandFailed(f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
            if redirect and proc.stdout != (REPO / redirect).read_text():
                raise CommandFailed(f"its output differs from {redirect}: regenerate the file with this command")
            return
        if module == "verl_npu.config.sections_gen":  # the generated typed sections: the file is what it writes
            from verl_npu.config import sections_gen

            if sections_gen.render() != (REPO / "verl_npu" / "config" / "sections.py").read_text():
                raise CommandFailed("verl_npu/config/sections.py is stale: run this command")
            return
        if module == "verl_npu.tools.retrieval_server":
            from verl_npu.tools.retrieval_server import build_parser

            ctx.allow("server")
            _check_flags_known(build_parser(), rest, module)
            return
        if module.split(".")[0] == "verl":
            check_upstream_verl(module, rest, ctx)
            return
        raise CommandFailed(f"no check for python -m {module}; add one to tests/helpers/doc_commands_check.py")
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
        proc = subprocess.run(
            [sys.executable, str(script), "--help"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        if proc.returncode != 0:
            raise CommandFailed(f"--help failed: {proc.stderr.strip()[-600:]}")
        for flag in _flags(args[1:]):
            if flag not in proc.stdout:
                raise CommandFailed(f"--help does not list {flag}")
        return
    raise CommandFailed(f"no check for python {args[0]}; add one to tests/helpers/doc_commands_check.py")


def check_upstream_verl(module: str, args: list[str], ctx: Context) -> None:
    """`python -m verl.model_merger ...` / `python -m verl.trainer.main_ppo ...` (upstream verl)."""
    ctx.allow("verl-tools")
    if module == "verl.model_merger":
        tested = (REPO / "tests" / "trainer" / "test_verl_interop.py").read_text()
        if not args or args[0] not in ("merge", "test"):
            raise CommandFailed(f"verl.model_merger takes merge or test, got {args[:1]}")
        for flag in _flags(args[1:]):
            if f'"{flag}"' not in tested:
                raise CommandFailed(f"verl.model_merger {flag}: not a flag tests/trainer/test_verl_interop.py runs")
        return
    if module == "verl.trainer.main_ppo":
        from verl_npu.config import expand_key
        from verl_npu.config.schema import SCHEMA

        for arg in args:
            key = expand_key(arg.split("=", 1)[0].lstrip("+"))
            if "=" not in arg or key not in SCHEMA:
                raise CommandFailed(f"{arg}: not a key=value override of verl's config language")
        return
    raise CommandFailed(f"no check for python -m {module}; add one to tests/helpers/doc_commands_check.py")


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
            raise CommandFailed(f"no check for bash {args[0]}; add one to tests/helpers/doc_commands_check.py")
    else:
        raise CommandFailed(f"no check for {exe!r}; add one to tests/helpers/doc_commands_check.py")


def check_command(cmd: Command, ctx: Context) -> None:
    """Raises CommandFailed when the quoted command does not work (see the module doc)."""
    if not looks_like_command(cmd.text, cmd.strict):
        if cmd.strict:
            raise CommandFailed("not a command any check knows; add one to tests/helpers/doc_commands_check.py")
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
