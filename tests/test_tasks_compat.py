"""axa_django.backends needs django.tasks: a clear ImportError before Django 6.0."""

import importlib

import django
import pytest


def test_importing_the_backend_says_which_django_it_needs():
    if django.VERSION >= (6, 0):
        module = importlib.import_module("axa_django.backends")
        assert module.QueueBackend.supports_get_result is True
        return
    with pytest.raises(ImportError, match=r"axa_django.backends needs Django >= 6.0 \(django.tasks\)"):
        importlib.import_module("axa_django.backends")
