"""Shipped recipes: find by name (`recipes/**/NAME.yaml`) or path, list them, copy one for editing.

The recipes folder is `<repo>/recipes` next to the `verl_npu` package, or `$VERL_NPU_RECIPES_DIR`.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_npu.errors import UserError


def recipes_dir() -> Path:
    """The folder holding shipped recipes."""
    env = os.environ.get("VERL_NPU_RECIPES_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "recipes"


@dataclass(frozen=True)
class RecipeInfo:
    """A shipped recipe: its name (file stem), file, and the first line of its header comment."""

    name: str
    path: Path
    summary: str


def _summary(path: Path) -> str:
    """The first sentence of the header comment's first paragraph (its lines joined, never cut mid-sentence)."""
    words: list[str] = []
    try:
        for line in path.read_text(encoding="utf-8").splitlines():
            text = line.strip().lstrip("#").strip()
            if not line.strip().startswith("#") or not text or set(text) <= set("-=#"):
                if words or (line.strip() and not line.strip().startswith("#")):
                    break
                continue
            words.append(text)
    except OSError:
        pass
    paragraph = " ".join(words)
    end = re.search(r"[.!?](\s|$)", paragraph)
    return paragraph[: end.start() + 1] if end else paragraph


def list_recipes() -> list[RecipeInfo]:
    """Every `recipes/**/*.yaml`, sorted by name."""
    root = recipes_dir()
    files = sorted(root.rglob("*.yaml")) if root.is_dir() else []
    return sorted((RecipeInfo(f.stem, f, _summary(f)) for f in files), key=lambda r: (r.name, str(r.path)))


def find_recipe(name_or_path: str | os.PathLike) -> Path:
    """A recipe file from a shipped name (`qwen25vl_geo3k`) or a path. UserError when not found."""
    text = str(name_or_path)
    candidate = Path(os.path.expanduser(text))
    looks_like_path = candidate.suffix in (".yaml", ".yml") or os.sep in text or "/" in text
    if candidate.is_file():
        return candidate
    if looks_like_path:
        raise UserError(f"recipe file not found: {text} (relative paths start at {Path.cwd()})")
    matches = [r for r in list_recipes() if r.name == text]
    if len(matches) == 1:
        return matches[0].path
    if len(matches) > 1:
        raise UserError(
            f"recipe name '{text}' is ambiguous: "
            + ", ".join(str(m.path) for m in matches)
            + "; pass the file path instead"
        )
    names = [r.name for r in list_recipes()]
    close = difflib.get_close_matches(text, names, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise UserError(
        f"no recipe named '{text}'.{hint} Shipped recipes: {', '.join(names) or '(none)'}; "
        "or pass a path to a .yaml file."
    )


def placeholders(path: Path) -> dict[str, str]:
    """{full dotted key: its EDIT_ME placeholder text} of a recipe file, in file order. The whole tree is walked,
    whatever its sections: an SFT recipe's `model.path` is a placeholder as an RL recipe's is."""
    from verl_npu.config.tree import is_placeholder, read_yaml_file

    found: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        elif is_placeholder(node):
            found[prefix] = node

    walk(read_yaml_file(path), "")
    return found


def placeholder_fields(path: Path) -> list[str]:
    """Full dotted keys in a recipe file whose value is an EDIT_ME placeholder, in file order (`placeholders`)."""
    return list(placeholders(path))


def copy_recipe(name_or_path: str, dest: str | os.PathLike) -> tuple[Path, list[str]]:
    """Copy a recipe to `dest` (a file, or a folder that gets NAME.yaml). Refuses to overwrite.
    Returns (the new file, the placeholder keys the user must edit)."""
    src = find_recipe(name_or_path)
    target = Path(dest)
    if target.is_dir():
        target = target / src.name
    if target.exists():
        raise UserError(
            f"{target} already exists; verl-npu cp does not overwrite. Pick another "
            "destination or delete the file first."
        )
    if not target.parent.is_dir():
        raise UserError(f"folder {target.parent} does not exist; create it first (mkdir -p {target.parent})")
    shutil.copyfile(src, target)
    return target, placeholder_fields(target)
