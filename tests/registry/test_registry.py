"""No registry name is compared as a string outside the code that registers it: callers ask the spec.

Every comparison (`==`, `!=`, `in`, `not in`) in verl_npu/ whose one side is a string constant (or a tuple /
set / list of them) that names an entry of a registry (`verl_npu.registry`) fails this test, except in the
module that declares that entry (which may speak of itself) and the few places listed in ALLOWED, each with
why the string there is not the registry's name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from verl_npu import registry

PACKAGE = Path(__file__).resolve().parents[2] / "verl_npu"

#: (file under verl_npu/, name) -> why the comparison there is not a registry lookup
ALLOWED: dict[tuple[str, str], str] = {
    ("doctor.py", "hf"): "the value of doctor's own --rollout option (hf / vllm / auto), not a config name",
    ("doctor.py", "vllm"): "doctor's --rollout option, and vllm's distribution name in the version table",
    ("doctor_train.py", "vllm"): "doctor's --rollout option (which model the training check picks)",
    ("doctor_versions.py", "vllm"): "the vllm package's name in the version table",
    ("config/paths.py", "file"): "a kind of path (a file, not a folder), not the metrics.jsonl sink",
    ("tool_registry.py", "file"): "a tool class given by a file path, not the metrics.jsonl sink",
    ("tools/loading.py", "file"): "a tool class given by a file path, not the metrics.jsonl sink",
    (
        "workers/weight_transfer.py",
        "file",
    ): "the weight transfer's file backend (a shared-memory file), not the metrics.jsonl sink",
    ("data/dataset.py", "reward_model"): "the parquet column reward_model (verl's data format), not the role",
}


#: packages that read another system's config (Trinity-RFT's, ROLL's): a value there such as ROLL's
#: adv_estimator "gae" or Trinity's policy loss "vanilla" is that system's word, which the importer maps
#: onto ours; the recipe it writes is then validated against the registries like any other
FOREIGN_CONFIG_READERS = ("importers/",)


def registered_names() -> dict[str, str]:
    """name -> the registry that holds it."""
    names = {}
    for reg in registry.ALL:
        for name in reg.specs:
            names[name] = reg.what
    return names


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def comparisons_with_names(path: Path, names: dict[str, str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            continue
        for side in [node.left, *node.comparators]:
            found += [(node.lineno, s) for s in _strings(side) if s in names]
    return found


def declaring_files() -> dict[str, set[str]]:
    """name -> the files (relative to verl_npu/) that declare it."""
    files: dict[str, set[str]] = {}
    for reg in registry.ALL:
        for name, spec in reg.specs.items():
            module = spec.target.partition(":")[0]
            rel = module.removeprefix("verl_npu.").replace(".", "/")
            files.setdefault(name, set()).update({rel + ".py", rel + "/__init__.py"})
    return files


def test_no_registry_name_is_compared_as_a_string_outside_its_registry():
    names, own = registered_names(), declaring_files()
    assert {"hf", "vllm", "critic", "reward_model", "remax", "dapo", "gspo"} <= set(names)
    assert {"token", "sequence", "token_k1", "seq_max_k3", "ppo_clip", "reinforce"} <= set(names)  # corrections
    assert {"gsm8k", "search", "image_zoom_in", "code_interpreter"} <= set(names)  # tools
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("registry/"):
            continue
        if rel.startswith(FOREIGN_CONFIG_READERS):  # their strings are another system's config values
            continue
        for line, name in comparisons_with_names(path, names):
            if rel in own.get(name, ()) or (rel, name) in ALLOWED:
                continue
            offenders.append(f"verl_npu/{rel}:{line}: compares with {name!r} ({names[name]}): ask its spec")
    assert offenders == [], "\n".join(offenders)


def test_the_scan_finds_a_comparison(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('def f(cfg):\n    return cfg.rollout.name == "hf" or cfg.est in ("remax", "other")\n')
    assert comparisons_with_names(sample, registered_names()) == [(2, "hf"), (2, "remax")]


def test_every_declared_spec_is_bound_to_its_implementation_one_to_one():
    """Importing each declaring module binds exactly the declared object under each name, and nothing
    else is bound (the source read and the import agree)."""
    problems = []
    for reg in registry.ALL:
        problems += reg.check_bound()
        assert set(reg.implementations) >= set(reg.specs), reg.what
        extra = {n for n in reg.implementations if n not in reg.specs}
        assert extra == set(), f"{reg.what}: bound but not declared in the source: {extra}"
    assert problems == []


def test_specs_are_read_without_importing_the_implementations():
    import subprocess
    import sys

    code = (
        "import sys\nfrom verl_npu import registry\n"
        "print(sorted(registry.ROLLOUT_ENGINES.specs), registry.ADVANTAGE_ESTIMATORS.spec('gae').needs_critic,"
        " registry.ROLLOUT_ENGINES.spec('hf').on_actor_module, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["['hf',", "'vllm']", "True", "True", "False"]


def test_a_declaration_with_a_non_literal_argument_is_refused(tmp_path):
    path = tmp_path / "loss.py"
    path.write_text(
        "from verl_npu.registry import POLICY_LOSSES\nDOC = 'ok'\n\n\n"
        "@POLICY_LOSSES.register('mine', doc=DOC + ' too')\ndef mine(*a, **k):\n    return {}\n\n\n"
        "@POLICY_LOSSES.register('other', doc=str(1))\ndef other(*a, **k):\n    return {}\n"
    )
    assert registry.POLICY_LOSSES.spec(f"{path}:mine").doc == "ok too"
    assert "must be literals" in registry.POLICY_LOSSES.file_problem(f"{path}:other")
    assert registry.ROLLOUT_ENGINES.user_files is False  # engines are named only by the registry
    with pytest.raises(registry.RegistryError, match="unknown rollout engine"):
        registry.ROLLOUT_ENGINES.spec(f"{path}:mine")


def test_rollout_corrections_and_tools_are_read_from_their_registries_without_torch():
    """The config layer's tables of rollout-correction modes and built-in tools are their registries' specs,
    read from the decorators' source: no torch, no tool module imported."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom verl_npu import rollout_corrections as rc, tool_registry as tr\n"
        "from verl_npu.config.schema import SCHEMA\n"
        "print(list(rc.ROLLOUT_IS_LEVELS), list(rc.BYPASS_LOSS_TYPES), len(rc.ROLLOUT_RS_OPTIONS),\n"
        "      SCHEMA['backend_config.algorithm.rollout_correction.rollout_is'].choices,\n"
        "      tr.BUILTIN_TOOLS['search'], sorted(tr.IMAGE_TOOLS), tr.VERL_CLASS_PATHS['verl.tools.gsm8k_tool.Gsm8kTool'],\n"
        "      'torch' in sys.modules, any(m.startswith('verl_npu.tools') for m in sys.modules), sep='|')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().split("|") == [
        "['token', 'sequence']",
        "['ppo_clip', 'reinforce']",
        "11",
        "('token', 'sequence')",
        "verl_npu.tools.search:SearchTool",
        "['image_zoom_in']",
        "gsm8k",
        "False",
        "False",
    ]


def test_a_rejection_option_is_judged_by_what_its_spec_declares():
    """The same k-statistic, judged per token or per response as each option's spec says (and k1's ratio
    bounds): the tensor code asks the spec, not the option's spelling."""
    import torch

    from verl_npu.algorithms.rollout_correction import rollout_rejection_mask

    spec = registry.ROLLOUT_CORRECTIONS.spec
    assert (spec("token_k2").per_token, spec("seq_mean_k2").per_token, spec("seq_mean_k2").statistic) == (
        True,
        False,
        "k2",
    )
    assert spec("seq_sum_k1").ratio_bounds and not spec("seq_max_k3").ratio_bounds
    log_ratio = torch.tensor([[0.0, 2.0, 0.0], [0.1, 0.1, 0.1]])
    mask = torch.ones(2, 3)
    by_token, _ = rollout_rejection_mask(log_ratio, mask, "token_k2", 1.0)  # k2 = d^2/2: 2.0 -> 2 > 1
    by_max, _ = rollout_rejection_mask(log_ratio, mask, "seq_max_k2", 1.0)
    by_mean, _ = rollout_rejection_mask(log_ratio, mask, "seq_mean_k2", 1.0)  # row 0's mean k2: 2/3 <= 1
    assert by_token.tolist() == [[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    assert by_max.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert by_mean.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
