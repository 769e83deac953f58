"""``python -m serve demo``: the Gradio web demo; gradio and torch are imported only where needed."""
