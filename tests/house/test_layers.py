"""The package's layers import one way, and nothing imports in a circle (docs/architecture.md).

Every `import` of a verl_npu module is read from the source (the AST), inside functions too, so a lazy
import counts like a top-level one. Layers, lowest first:

    0  bottom: errors, batch, device, device_env, device_tables, host, algorithms, optim, hub, the extension points'
       registries (registry: specs read from the implementations' source, nothing imported),
       rollout_corrections, tool_registry, distillation_losses
    1  config (recipe files found and copied by config/recipes.py)
    2  models, rewards (the scores of answers), memory (the planner: formulas over a resolved config)
    3  tools (the answer-check tools score with rewards; the grid environments and their demo maps)
    4  data (datasets, and the prep that writes rows, grid episodes played by the tools' environments);
       importers (other systems' configs as recipes, validated with config's loader)
    5  rollout
    6  workers
    7  trainer, sft (the SFT loop reuses the trainer's tracking and checkpoints)
    8  cli, doctor, demo, cluster, stages (runs an SFT then an RL stage through the cli's commands)

A module may import its own layer or lower ones, and no two packages (folders) import each other, even
through others: a folder reads as one room, above all it imports. The config layer imports nothing
heavy: none of its files imports torch, ray, vllm or transformers anywhere, and neither does any module
it reaches (followed through their module-level imports: what importing them costs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "verl_npu"

LAYERS = [
    (r"verl_npu\.(cli|doctor|doctor_train|doctor_versions|demo|cluster|stages)$", 8),
    (r"verl_npu\.trainer(\..*)?$", 7),
    (r"verl_npu\.sft(\..*)?$", 7),
    (r"verl_npu\.workers(\..*)?$", 6),
    (r"verl_npu\.rollout(\..*)?$", 5),
    (r"verl_npu\.importers(\..*)?$", 4),
    (r"verl_npu\.data(\..*)?$", 4),
    (r"verl_npu\.tools(\..*)?$", 3),
    (r"verl_npu\.(models|rewards|memory)(\..*)?$", 2),
    (r"verl_npu\.config(\..*)?$", 1),
    (
        r"verl_npu(\.(errors|batch|device|device_env|device_tables|host|algorithms(\..*)?|optim|hub|registry(\..*)?"
        r"|rollout_corrections|tool_registry|distillation_losses))?$",
        0,
    ),
]
HEAVY = ("torch", "ray", "vllm", "vllm_ascend", "torch_npu", "transformers")

#: imports that still run upward (none: issue 22's engine step moved the pieces they needed down:
#: the rollout engines receive weights instead of fetching them, the worker profiler and the torch
#: checkpoint files live under workers/). Kept so that the test says what an exception would be.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, *, top_level_only: bool = False) -> tuple[set[str], set[str]]:
    """(verl_npu modules, other top-level packages) that `path` imports: anywhere, or only in its
    module body (not inside functions or classes) with `top_level_only`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    ours, others = set(), set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("verl_npu"):
                while name not in MODULES:  # `import verl_npu.x.y` of a name inside a module
                    name = name.rpartition(".")[0]
                if name != me:
                    ours.add(name)
            else:
                others.add(name.split(".")[0])
    return ours, others


EDGES = {name: _imports(path)[0] for name, path in MODULES.items()}


def layer(module: str) -> int:
    for pattern, number in LAYERS:
        if re.match(pattern, module):
            return number
    raise AssertionError(f"{module} has no layer: add it to LAYERS (and to docs/architecture.md)")


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones():
    assert len(MODULES) > 60
    upward = {(a, b) for a, targets in EDGES.items() for b in targets if layer(b) > layer(a)}
    assert upward - KNOWN_UPWARD == set(), "imports that run upward: " + ", ".join(
        f"{a} (layer {layer(a)}) -> {b} (layer {layer(b)})" for a, b in sorted(upward - KNOWN_UPWARD)
    )
    assert KNOWN_UPWARD - upward == set(), f"gone, remove them from KNOWN_UPWARD: {sorted(KNOWN_UPWARD - upward)}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_sits_in_an_import_cycle():
    assert _cycles(EDGES) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check itself


def test_no_package_sits_in_an_import_cycle():
    """Modules folded to their package (`verl_npu.tools.envs.grid` -> `verl_npu.tools`): rewards -> data ->
    tools -> rewards was such a circle, without any module in one."""

    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for a, targets in EDGES.items():
        folded.setdefault(package(a), set()).update(package(b) for b in targets if package(b) != package(a))
    assert len(folded) > 20 and _cycles(folded) == []


def test_the_config_layer_reaches_nothing_heavy_even_inside_functions():
    config = [name for name in MODULES if layer(name) == 1]
    seen, pending, heavy = set(), list(config), []
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        ours, others = _imports(MODULES[name], top_level_only=name not in config)
        heavy += [f"{name} imports {pkg}" for pkg in sorted(set(others) & set(HEAVY))]
        pending += sorted(ours)
    assert "verl_npu.config.rules" in seen and "verl_npu.registry" in seen
    assert heavy == [], heavy


def test_validating_a_vllm_recipe_imports_no_torch():
    """The config checks that depend on the device (vLLM's chunked prefill on CPU, the profiler tools)
    ask `device.configured_device`, which knows the kind without importing torch."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom verl_npu.config import load_recipe\n"
        "rc = load_recipe('tiny_gsm8k', ['actor_rollout_ref.rollout.name=vllm', 'global_profiler.tool=torch',"
        " 'global_profiler.steps=[1]', 'actor_rollout_ref.actor.profiler.enable=true',"
        " 'actor_rollout_ref.actor.profiler.all_ranks=true'])\n"
        "print(rc.backend.actor_rollout_ref.rollout.enable_chunked_prefill, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    chunked, torch_imported = out.stdout.split()
    assert torch_imported == "False"
    assert chunked == ("True" if Path("/proc/driver/nvidia/version").exists() else "False")  # a CPU plans no chunks
