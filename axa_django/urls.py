"""URLs to include in a project: ``path("jobs/", include("axa_django.urls"))`` serves ``jobs/metrics``."""

from django.urls import path

from . import views

app_name = "axa_django"

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("dashboard.json", views.dashboard_data, name="dashboard-data"),
]
