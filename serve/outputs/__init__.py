"""Step 4 of the tagging pipeline, shared with the demo and the predictor: scores -> tags -> records -> the files a run
leaves; :mod:`~serve.outputs.stage` ties them together."""
