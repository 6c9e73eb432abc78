"""Argument types the management commands share: whole numbers and seconds, refused with one message each."""

from __future__ import annotations

import argparse
import math


def whole(text: str, least: int, what: str = "") -> int:
    """``text`` as an int of at least ``least``; ``what`` names the unit in the message ("workers")."""
    try:
        value = int(text)
    except ValueError:
        unit = f" of {what}" if what else ""
        raise argparse.ArgumentTypeError(f"expected a whole number{unit}, got {text!r}") from None
    if value < least:
        bound = "at least 1" if least == 1 else f"{least} or more"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
    return value


def seconds(text: str, allow_zero: bool = False) -> float:
    """``text`` as a finite number of seconds, above 0 (or from 0 with ``allow_zero``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (value >= 0 if allow_zero else value > 0) or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a {'' if allow_zero else 'positive '}number of seconds, got {text}")
    return value
