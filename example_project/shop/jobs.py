"""The shop's background jobs. axa_django imports every app's jobs.py at start-up,
so the web process (which enqueues) and the worker (which runs) both know them."""

import hashlib
import random

from axa_django import background_job

# Share of attempts the pretend payment gateway fails.
GATEWAY_FAILURE_RATE = 0.4


class PaymentGatewayError(Exception):
    """The pretend payment gateway did not answer."""


@background_job
def send_welcome_email(user_id: int, email: str) -> dict:
    """Render a welcome email (and pretend to send it); always succeeds."""
    body = f"Hello {email},\n\nwelcome to the shop! Your customer number is {user_id}.\n"
    return {"to": email, "subject": "Welcome!", "words": len(body.split())}


# Three attempts, retried at once (backoff=0) so that `demo --burst` drains every retry;
# real jobs keep the default exponential backoff.
@background_job(max_attempts=3, backoff=0)
def charge_card(order_id: int, amount_cents: int) -> dict:
    """Charge an order through a flaky pretend gateway: fails 40% of attempts."""
    if random.random() < GATEWAY_FAILURE_RATE:
        raise PaymentGatewayError(f"gateway timed out charging order {order_id}")
    receipt = hashlib.sha256(f"{order_id}:{amount_cents}".encode()).hexdigest()[:12]
    return {"order": order_id, "charged_cents": amount_cents, "receipt": receipt}
