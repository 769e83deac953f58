"""``python -m serve demo``: the Gradio web demo, from small named parts: :mod:`~serve.demo.app` (the page and its
launch), :mod:`~serve.demo.layout` and :mod:`~serve.demo.handlers` (its controls and what they do),
:mod:`~serve.demo.model_store` and :mod:`~serve.demo.catalog` (models and examples), :mod:`~serve.demo.results`
(pure helpers), and the answer tabs (:mod:`~serve.demo.review`, :mod:`~serve.demo.review_tab`,
:mod:`~serve.demo.toggles_tab`). gradio and torch are imported inside the functions that need them.
"""
