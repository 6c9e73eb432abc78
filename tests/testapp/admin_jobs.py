"""Jobs for the admin tests."""

from axa_django import background_job


@background_job(unique=lambda account: f"account:{account}")
def refresh_account(account: int) -> int:
    """At most one queued or running per account: the unique job the retry tests retry."""
    return account
