from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "example_project.shop"
    verbose_name = "Shop (axa-django example)"
