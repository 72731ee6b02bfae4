from verl_npu.errors import ConfigErrors, Problem, UserError


def test_config_errors_lists_every_problem_with_key_and_fix():
    errors = ConfigErrors(
        [
            Problem("backend_config.data.train_files", "is a placeholder", "set it to your train.parquet"),
            Problem("af_output_dir", "is missing"),
        ],
        source="recipes/x.yaml",
    )
    text = str(errors)
    assert isinstance(errors, UserError)
    assert text.startswith("2 config problem(s) in recipes/x.yaml")
    assert "backend_config.data.train_files: is a placeholder" in text
    assert "fix: set it to your train.parquet" in text
    assert "af_output_dir: is missing" in text
