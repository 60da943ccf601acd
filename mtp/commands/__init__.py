"""The command-line programs. Each module's ``main(argv)`` is the program (raising UserError on bad input) and its
``entry_point()`` runs it under mtp.commands.cli's error handler: ``python scripts/<name>.py`` and the installed
``mtp-<name>`` entry points (pyproject.toml) call ``entry_point()``."""
