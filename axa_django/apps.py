"""AppConfig: loads every installed app's jobs.py so every process knows every job."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

from . import checks  # noqa: F401 - registers the system checks


class AxaDjangoConfig(AppConfig):
    name = "axa_django"
    verbose_name = "Background jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import workflows  # noqa: F401 - registers the batch callback job in every process

        autodiscover_modules("jobs")
