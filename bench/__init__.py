"""Benchmarks: ``python -m bench.<name>`` from a checkout (this package is not installed with ``spml``).

Each benchmark writes its current table, the exact command, the machine line and the date into its own section
of ``bench/README.md`` (the one results page; :mod:`bench.results_page`). Benchmarks import the product packages
(``models``, ``train``, ``export``, ``serve``); the product packages never import ``bench``.
"""
