"""Training of single-positive multi-label classifiers (``python -m train``).

Importing this package is cheap and pulls in neither gradio nor onnxruntime, so training runs on a
machine that has only torch and torchvision.

Layering: ``train`` may import ``models`` only; ``serve``, ``export`` and ``bench`` may import it.
"""
