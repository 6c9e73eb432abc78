"""URLs of the example site: the shop page at /, Django's admin at /admin/."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("example_project.shop.urls")),
]
