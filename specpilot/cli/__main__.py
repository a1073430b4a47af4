"""`python -m specpilot.cli`: the command, as the console script runs it."""

from specpilot.cli import main

main()
