"""Trinity-RFT's `stages:` (an SFT warm-up, then RFT) -> verl-npu's two-stage recipe (docs/sft.md, 'SFT then RL').

Each Trinity stage is the top-level config with the stage's own fields merged over it (a dict field merged key by
key). The first stage must be the SFT one (`algorithm.algorithm_type: sft`), the second the RL one, as verl-npu's
stages recipe runs them. The import writes three files: the RL recipe (the top-level config, the second stage), the
SFT stage's recipe beside it (`<recipe>.sft.yaml`) and the stages recipe naming both (`<recipe>.stages.yaml`:
`verl-npu run` on it trains the SFT stage, then RL from its checkpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_npu.importers.ledger import NOT_MAPPED, Ledger, Row, flatten_input

RL_STAGE_KEYS = ("stage_name", "mode")


def merged(base: dict, stage: dict) -> dict:
    """`stage`'s fields over `base`, dicts merged key by key (a stage's `buffer:` replaces only what it sets)."""
    out = dict(base)
    for key, value in stage.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _is_sft(stage: Any) -> bool:
    return isinstance(stage, dict) and str((stage.get("algorithm") or {}).get("algorithm_type", "")).lower() == "sft"


def map_stages(led: Ledger, raw: dict) -> None:
    """Rows for every `stages[...]` key and, for an SFT-then-RL pair, the SFT recipe (`extra_files['sft.yaml']`)."""
    from verl_npu.importers.output import ImportResult, recipe_yaml
    from verl_npu.importers.sft import map_trinity_sft

    stages = raw.get("stages")
    if not stages:
        return
    if not (isinstance(stages, list) and len(stages) == 2 and _is_sft(stages[0]) and not _is_sft(stages[1])):
        led.not_mapped_under(
            "stages",
            "not mapped: verl-npu's stages recipe runs two stages, an SFT stage "
            "(algorithm_type sft) then the RL run; import each stage's config by itself instead",
        )
        return
    base = {k: v for k, v in raw.items() if k != "stages"}
    sub = Ledger(
        "trinity", flatten_input(merged(base, {k: v for k, v in stages[0].items() if k != "stage_name"})), kind="sft"
    )
    map_trinity_sft(sub)
    sub_rows = {row.key: row for row in sub.finish()}
    for key in led.under("stages[0]"):
        inner = key[len("stages[0].") :]
        row = sub_rows.get(inner)
        if inner == "stage_name":
            led.accept(key, "the SFT stage (the stages recipe names it sft)")
        elif row is not None and row.status != NOT_MAPPED:
            led.rows[key] = Row(key, led.flat[key], row.status, f"SFT stage: {row.target}", row.note)
        else:
            led.not_mapped(key, f"not mapped (SFT stage): {row.note if row else 'no verl-npu SFT option'}")
    for key in led.under("stages[1]"):
        if key.split(".", 1)[1] in RL_STAGE_KEYS:
            led.accept(key, "the RL stage: the top-level config, imported as the RL recipe")
        else:
            led.not_mapped(
                key,
                "not mapped: the RL stage is imported from the config's top level; move this "
                "setting there and import again",
            )
    led.extra_files["sft.yaml"] = recipe_yaml(ImportResult.from_ledger(sub, Path("stages[0]")))
    led.notes += [f"SFT stage: {note}" for note in sub.notes]
