"""What an import produces: the recipe text (each value commented with where it came from), the key
table, and the verdict of verl-npu's own loader on the recipe."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_npu.config.tree import scalar
from verl_npu.errors import ConfigErrors, UserError
from verl_npu.importers.ledger import DEFAULT, MAPPED, NOT_MAPPED, Ledger, Row, nested

#: the recipe's top-level blocks, in the order shipped recipes write them
TOP_ORDER = ("af_output_dir", "backend_config", "engine_kwargs")
SECTION_ORDER = (
    "data",
    "model",
    "engine",
    "optim",
    "checkpoint",
    "actor_rollout_ref",
    "critic",
    "reward_model",
    "custom_reward_function",
    "algorithm",
    "trainer",
)


@dataclass
class ImportResult:
    """An import: the rows of the key table, the recipe keys (full dotted -> value) and their
    origins, what the user must do next, and (after `validate`) the loader's problems."""

    system: str
    source: Path
    rows: list[Row]
    recipe: dict[str, Any]
    origin: dict[str, str]
    notes: list[str]
    refused: str = ""  # why no recipe was written at all (then recipe is empty)
    extra_files: dict[str, Any] = field(default_factory=dict)  # suffix -> YAML tree (or text) beside the recipe
    problems: list[str] = field(default_factory=list)
    validated: bool = False
    kind: str = "rl"  # "rl" (verl-npu run) or "sft" (verl-npu sft)

    @classmethod
    def from_ledger(cls, ledger: Ledger, source: Path, refused: str = "") -> ImportResult:
        return cls(
            ledger.system,
            source,
            ledger.finish(),
            dict(ledger.recipe),
            dict(ledger.origin),
            list(ledger.notes),
            refused,
            dict(ledger.extra_files),
            kind=ledger.kind,
        )

    def rows_with(self, status: str) -> list[Row]:
        return [r for r in self.rows if r.status == status]


def recipe_yaml(result: ImportResult) -> str:
    """The recipe as YAML, every value followed by a comment naming its source key and arithmetic."""
    what = "an SFT recipe (`verl-npu sft`" if result.kind == "sft" else "a verl-npu recipe (`verl-npu run`"
    lines = [
        f"# Imported by `verl-npu import {result.system} {result.source.name}`: {what}; verl 0.9.1 keys",
        "# under backend_config; docs/import.md). Each value's comment names the input key it came from",
        f"# ('{result.system}: key'), the arithmetic, or the {result.system} default written out because",
        "# verl's differs. Keys the import could not map are listed in the table it printed (not here).",
    ]
    for note in result.notes:
        lines += textwrap.wrap(note, 110, initial_indent="# NEXT: ", subsequent_indent="#       ")
    tree = nested(result.recipe)
    if "backend_config" in tree:
        bc = tree["backend_config"]
        tree["backend_config"] = {
            k: bc[k]
            for k in sorted(bc, key=lambda k: SECTION_ORDER.index(k) if k in SECTION_ORDER else len(SECTION_ORDER))
        }
    for top in sorted(tree, key=lambda k: TOP_ORDER.index(k) if k in TOP_ORDER else len(TOP_ORDER)):
        _emit(top, tree[top], 0, top, result.origin, lines)
    if "engine_kwargs" not in tree and result.kind != "sft":
        lines.append("engine_kwargs:")
        lines.append("  vllm: {}")
    return "\n".join(lines) + "\n"


def _emit(key: str, node: Any, indent: int, path: str, origin: dict[str, str], lines: list[str]) -> None:
    pad = "  " * indent
    if isinstance(node, dict) and node and path not in origin:
        lines.append(f"{pad}{key}:")
        for k, v in node.items():
            _emit(k, v, indent + 1, f"{path}.{k}", origin, lines)
        return
    text = f"{pad}{key}: {scalar(node)}"
    why = origin.get(path, "")
    lines.append(f"{text}   # {why}" if why else text)


def table_text(result: ImportResult) -> str:
    """The key table: every input key, its value, and what became of it."""
    width = min(60, max([len(r.key) for r in result.rows] + [10]))
    out = [f"{'input key':<{width}}  {'status':<10}  recipe key / what to do instead"]
    for status in (MAPPED, DEFAULT, NOT_MAPPED):
        for r in result.rows_with(status):
            value = _short(r.value)
            where = r.target if status != NOT_MAPPED else ""
            note = r.note if r.note and r.note != "1:1" else ""
            tail = f"{where} ({note})" if where and note else (where or note)
            out.append(f"{r.key:<{width}}  {status:<10}  {tail}   [= {value}]")
    counts = ", ".join(f"{len(result.rows_with(s))} {s}" for s in (MAPPED, DEFAULT, NOT_MAPPED))
    out.append(f"{len(result.rows)} rows: {counts}")
    return "\n".join(out)


def _short(value: Any) -> str:
    text = (value if isinstance(value, str) else scalar(value)).replace("\n", "\\n")
    return text if len(text) <= 40 else text[:37] + "..."


def validate(result: ImportResult, recipe_path: Path, stages_path: Path | None = None) -> None:
    """Load the written recipe with verl-npu's loader for its kind (and the stages recipe naming it and the SFT
    stage, when there is one); record every problem they name (none: valid)."""
    from verl_npu.config import load_recipe
    from verl_npu.config.sft import load_sft_recipe
    from verl_npu.config.stages import load_stages

    checks = [(load_sft_recipe if result.kind == "sft" else load_recipe, recipe_path, "")]
    if stages_path is not None:
        checks.append((load_stages, stages_path, f"{stages_path.name}: "))
    result.problems = []
    for loader, path, prefix in checks:
        try:
            loader(path)
        except ConfigErrors as exc:
            result.problems += [prefix + str(p) for p in exc.problems if prefix + str(p) not in result.problems]
        except UserError as exc:
            result.problems.append(prefix + str(exc))
    result.validated = not result.problems


def write_recipe(result: ImportResult, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(recipe_yaml(result), encoding="utf-8")
    tmp.replace(out)
