"""The command lines of ``python -m serve``: one module per subcommand (``tag``, ``demo``, ``summary``), each with
its parser (``add_*_parser``), its cheap checks and its exit codes (``run_*``). ``--help`` and usage errors answer
without importing torch or a runtime."""
