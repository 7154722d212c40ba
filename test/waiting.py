"""Polling helper for tests that wait on other threads or processes (bounded, never a timing target)."""

import time


def wait_until(pred, timeout: float = 15.0, interval: float = 0.01) -> bool:
    """True as soon as ``pred()`` is, False after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return False
