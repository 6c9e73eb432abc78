"""Inside an installed app, but importing it raises SystemExit: resolving a task here must not stop a worker."""

raise SystemExit("boundary_import_raises: import side effect")
