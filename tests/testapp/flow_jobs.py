"""Jobs of the flow tests."""
