"""The dataset builders: they render or generate images and write the built datasets into the cache.

- ``builtin`` (presets, generation into the cache, its command line), ``builtin_scenes`` (the procedural scenes),
  ``builtin_attributes`` (the dense variant's attribute labels), ``shapes`` (the classes' geometry);
- the drawing sets: ``openclipart`` (the Open Clip Art Library's SVGs), ``tuxpaint`` (the Tux Paint stamps),
  ``icon_sets`` (npm icon sets), with ``drawings`` (rasterising a drawing) and ``drawing_sets`` (what the three
  share: keyword folding, digests, the cache build, notes, the command line).

Layering: ``models.sources`` imports :mod:`models.data` (types, the read side of the caches, where they live), never
the reverse at module level: :mod:`models.data.registry` imports a builder inside the loader of its kind only.
``train``, ``bench`` and the tests may import it; ``export`` and ``serve`` never do (tests/test_layering.py).
"""
