"""``python -m planrun``."""

from planrun.cli import main

main()
