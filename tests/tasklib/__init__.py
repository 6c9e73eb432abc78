"""A library that is not an installed app and defines tasks with the django-tasks backport,
as Wagtail's modelsearch does: tests/testapp imports it at start, as a site imports a library."""
