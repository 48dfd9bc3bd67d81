"""The command line: ``autofusion`` (subcommands in ``cmd_*.py``, shared helpers in ``common.py``)."""
