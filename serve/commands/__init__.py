"""The command lines of ``python -m serve``, one module per subcommand; ``--help`` and usage errors answer without
importing torch or a runtime."""
