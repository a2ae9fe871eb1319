"""``python -m etforge.cli``."""

from etforge.cli import run

run()
