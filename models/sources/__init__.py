"""The dataset builders, which generate or render images into the cache: the built-in procedural set (``builtin``,
``builtin_scenes``, ``builtin_attributes``, ``shapes``) and the drawing sets (``openclipart``, ``tuxpaint``,
``icon_sets``, sharing ``drawings`` and ``drawing_sets``). They import :mod:`models.data`, never the reverse at module
level; ``export`` and ``serve`` never import them (tests/test_layering.py).
"""
