"""The short summary printed at the end of a run: did it learn, and where to look.

Read from the run's ``metrics.jsonl`` (so a resumed run summarises every step it logged):

- the mean training reward (``critic/score/mean``) over the first and the last 10 logged steps;
- the share of the last step's responses cut at the token budget (``response_length/clip_ratio``:
  responses that never produced the end-of-turn token);
- the optimizer steps skipped for a non-finite gradient (``actor/skipped_updates``,
  ``critic/skipped_updates``), when there were any;
- with tools: the calls whose code ran WITHOUT an operating-system boundary (`isolation:
  unsafe_process`), the tools whose calls mostly failed in the last step that called them, and the calls
  of the last step with tool calls that named no known tool or could not be read (the model's mistakes);
- the last validation: mean reward and, where the reward logs one, accuracy, per data source;
- for the built-in demo tasks, the best expected score of a policy that ignores its input
  (``verl_npu.rewards.BLIND_CEILINGS``; only when the built-in rewards score the run);
- where the training curves (PNG) and the TensorBoard logs are, and the command that opens them.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from verl_npu.rollout.tool_calls import UNKNOWN_TOOL
from verl_npu.trainer.tracking import _read_jsonl

SCORE_KEY = "critic/score/mean"
WINDOW = 10


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def last_validation(rows: list[dict]) -> tuple[int | None, dict[str, float]]:
    """(step, metrics) of the last row holding ``val-*`` metrics; (None, {}) when none has."""
    for row in reversed(rows):
        val = {k: v for k, v in row.items() if k.startswith("val-") and isinstance(v, (int, float))}
        if val:
            return row.get("step"), val
    return None, {}


def tool_lines(rows: list[dict]) -> list[str]:
    """Summary lines about the tools (module docstring)."""
    lines = []
    unsafe = sum(float(r.get("tool_calls/unsafe_sandbox", 0) or 0) for r in rows)
    if unsafe:
        lines.append(
            f"  UNSAFE: model-written code ran without an operating-system boundary in {unsafe:.0f} tool "
            'calls (isolation: unsafe_process; docs/agents.md "The code interpreter sandbox")'
        )
    last: dict[str, float] = {}
    for r in rows:
        last.update({k: v for k, v in r.items() if k.startswith("tool_calls/") and k.endswith("/error_ratio")})
    # calls naming no tool, or unreadable, are the model's mistakes (always errors), not a failing tool
    last.pop(f"tool_calls/{UNKNOWN_TOOL}/error_ratio", None)
    failing = sorted(k[len("tool_calls/") : -len("/error_ratio")] for k, v in last.items() if v >= 0.5)
    if failing:
        lines.append(
            f"  tools whose calls mostly failed in the last step that called them: {', '.join(failing)} "
            "(tool_calls/<name>/error_ratio; the conversations in the rollout dumps show the errors)"
        )
    called = [r for r in rows if any(k.startswith("tool_calls/") and k.endswith("/count") for k in r)]
    if called:
        counts = {k: float(v) for k, v in called[-1].items() if k.startswith("tool_calls/") and k.endswith("/count")}
        unread = counts.get(f"tool_calls/{UNKNOWN_TOOL}/count", 0.0)
        if unread:
            lines.append(
                f"  calls that named no known tool or could not be read, in the last step with tool calls: "
                f"{unread:.0f} of {sum(counts.values()):.0f} (tool_calls/{UNKNOWN_TOOL}/count; each got an "
                "error message back)"
            )
    return lines


def run_summary(
    out_dir: str | Path, *, tensorboard_dir: str | Path | None = None, builtin_rewards: bool = True
) -> list[str]:
    """Lines of the end-of-run summary for the run in ``out_dir`` (see the module docstring).
    ``tensorboard_dir``: the run's TensorBoard folder, None when TensorBoard was not a logger;
    ``builtin_rewards``: False when a custom reward scored the run (no blind ceiling is quoted)."""
    from verl_npu.rewards import blind_ceiling

    out_dir = Path(out_dir)
    metrics = out_dir / "metrics.jsonl"
    rows = _read_jsonl(metrics) if metrics.is_file() else []
    scores = [float(r[SCORE_KEY]) for r in rows if isinstance(r.get(SCORE_KEY), (int, float))]
    lines = [f"summary of the run in {out_dir}:"]
    if scores:
        first, last = _mean(scores[:WINDOW]), _mean(scores[-WINDOW:])
        ratio = f" ({last / first:.1f}x)" if first > 0 else ""
        lines.append(
            f"  mean reward ({SCORE_KEY}): first {min(WINDOW, len(scores))} steps {first:.3f} -> "
            f"last {min(WINDOW, len(scores))} steps {last:.3f}{ratio}"
        )
    clipped = [
        r["response_length/clip_ratio"] for r in rows if isinstance(r.get("response_length/clip_ratio"), (int, float))
    ]
    if clipped:
        lines.append(f"  responses cut at the token budget (no end of turn), last step: {clipped[-1]:.0%}")
    for role in ("actor", "critic"):
        skipped = sum(float(r.get(f"{role}/skipped_updates", 0) or 0) for r in rows)
        if skipped:
            lines.append(
                f"  {role} optimizer steps skipped for a non-finite gradient: {skipped:.0f} "
                f"({role}/skipped_updates): the updates of those steps were dropped"
            )
    turns = [r for r in rows if isinstance(r.get("num_turns/mean"), (int, float))]
    if turns:  # multi-turn rollout (verl's metric names)
        lines.append(
            f"  multi-turn, last step: {turns[-1]['num_turns/mean']:.2f} turns and "
            f"{turns[-1].get('tool_call_counts/mean', 0.0):.2f} tool calls per trajectory "
            "(num_turns/mean, tool_call_counts/mean)"
        )
    lines += tool_lines(rows)
    step, val = last_validation(rows)
    # val-core/<source>/reward/...: a source may hold slashes (openai/gsm8k); not val-aux/num_turns/*
    sources = sorted(
        {k[len("val-core/") : k.rindex("/reward/")] for k in val if k.startswith("val-core/") and "/reward/" in k}
    )
    for src in sources:
        reward = next((v for k, v in val.items() if k.startswith(f"val-core/{src}/reward/")), None)
        acc = next((v for k, v in val.items() if k.startswith(f"val-aux/{src}/accuracy/")), None)
        parts = [
            f"reward {reward:.3f}" if reward is not None else None,
            f"accuracy {acc:.3f}" if acc is not None else None,
        ]
        lines.append(f"  validation ({src}, step {step}): {', '.join(p for p in parts if p)}")
    for src in sources if builtin_rewards else []:
        ceiling = blind_ceiling(src)
        if ceiling is not None:
            lines.append(
                f"  a policy that ignores the {ceiling[1]} scores at most {ceiling[0]:.3f} ({src}); "
                f"a reward above that means the policy reads the {ceiling[1]}"
            )
    curves = out_dir / "training_curves.png"
    if curves.is_file():
        lines.append(f"  training curves: {curves}")
    if tensorboard_dir is not None:
        lines.append(
            f"  TensorBoard logs: {tensorboard_dir}  (open them: tensorboard --logdir "
            f"{shlex.quote(str(tensorboard_dir))})"
        )
    return lines
