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

        if self.apps.is_installed("django.contrib.admin"):
            # The bulk operations' job, in every worker, also where the admin is registered by hand (SimpleAdminConfig).
            from .admin import bulkjob  # noqa: F401

        autodiscover_modules("jobs")
