"""Jobs of the ops tests."""
