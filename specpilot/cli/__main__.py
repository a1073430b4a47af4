"""`python -m specpilot.cli`: the command, as the console script runs it."""

from specpilot.cli import main

if __name__ == "__main__":  # a spawned child (serve's engine process) imports this module: it must not run
    main()
