"""The test site's URLs plus axa_django.urls under jobs/ (the ops tests' ROOT_URLCONF)."""

from django.urls import include, path

from tests.urls import urlpatterns as site

urlpatterns = [*site, path("jobs/", include("axa_django.urls"))]
