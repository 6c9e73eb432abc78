"""Writing rows: the options a job is enqueued with, checks at the boundary, the INSERTs."""
