"""Jobs of the workflow tests."""
