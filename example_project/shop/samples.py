"""Made-up arguments for the shop's jobs, shared by the page's form and `manage.py demo`."""

import random
from collections.abc import Callable
from typing import Any

from axa_django.registry import JobFunction

from . import jobs


def welcome_args(rng: random.Random) -> dict[str, Any]:
    user_id = rng.randint(1000, 99999)
    return {"user_id": user_id, "email": f"customer{user_id}@example.com"}


def charge_args(rng: random.Random) -> dict[str, Any]:
    return {"order_id": rng.randint(1, 10**6), "amount_cents": rng.randint(100, 50_000)}


# form value -> (job, argument maker, label)
KINDS: dict[str, tuple[JobFunction[..., Any], Callable[[random.Random], dict[str, Any]], str]] = {
    "welcome": (jobs.send_welcome_email, welcome_args, "Send welcome emails (always succeed)"),
    "charge": (jobs.charge_card, charge_args, "Charge cards (40% of attempts fail; 3 attempts each)"),
}
