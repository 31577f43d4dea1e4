"""Fixtures of the bad-input tests live in tests/conftest.py (``finished_run``, ``run_copy``), shared with
tests/test_model_check.py."""
