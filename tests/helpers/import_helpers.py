"""What every corpus import must show (tests/importers/test_import_trinity.py, tests/importers/test_import_roll.py): every input key has
a row of the table, every not-mapped row says what to do instead, every recipe value names its source, and the
recipe validates or each problem names the key it lacks (in the recipe, or in a stage of the stages recipe)."""

from __future__ import annotations

import re

from verl_npu.importers.ledger import NOT_MAPPED

#: a problem of the recipe (`backend_config.<key>: ...`) or of a stage of the stages recipe written beside it
NAMES_A_KEY = re.compile(r"^(\S+\.stages\.yaml: (sft|rl): )?backend_config\.")


def assert_every_key_is_in_the_table(result, keys: set[str]) -> None:
    assert {r.key for r in result.rows} >= keys, f"keys without a row: {sorted(keys - {r.key for r in result.rows})}"
    assert all(r.note for r in result.rows if r.status == NOT_MAPPED), "a not-mapped row says what to do instead"


def assert_valid_or_names_what_it_lacks(result) -> None:
    assert result.validated or result.problems
    bad = [p for p in result.problems if not NAMES_A_KEY.match(p)]
    assert not bad, bad
    assert set(result.recipe) <= set(result.origin), "every recipe value names its source"
