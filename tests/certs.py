"""Moved to tests/support/certs.py. Kept only for ``bench/s_fairness.py`` (``from tests.certs import CA``):
remove once bench imports ``tests.support.certs``."""

from tests.support.certs import CA, Pem

__all__ = ["CA", "Pem"]
