"""``python -m serve demo``: the Gradio web demo, from small named parts.

- :mod:`~serve.demo.app`: :func:`~serve.demo.app.build_demo` (the page from its parts) and
  :func:`~serve.demo.app.launch_demo`;
- :mod:`~serve.demo.layout`: the page's controls and tabs;
- :mod:`~serve.demo.handlers`: what the page does (score an image, re-filter, tag a batch, change model);
- :mod:`~serve.demo.model_store`: the models the picker offers, loaded lazily;
- :mod:`~serve.demo.catalog`: model files under the runs folder, example images;
- :mod:`~serve.demo.review` and :mod:`~serve.demo.review_tab`: the *Review* tab (``--review FILE``): suggested
  labels answered one at a time into an answer log, its state (no gradio) and its layout and handlers;
- :mod:`~serve.demo.results`: the pure helpers (thresholds and tags of the controls, the result document, the score
  HTML, the batch downloads).

gradio and torch are imported inside the functions that need them, so ``python -m serve --help`` answers at once.
"""
