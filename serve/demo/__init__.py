"""``python -m serve demo``: the Gradio web demo (the page, its layout and handlers, models and examples, pure helpers,
and the answer tabs). gradio and torch are imported inside the functions that need them."""
