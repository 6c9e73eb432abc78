from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.index, name="index"),
    path("jobs/", views.jobs_table, name="jobs"),
]
