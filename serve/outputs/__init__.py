"""Step 4 of the tagging pipeline, shared with the demo and the predictor: an image's scores -> its tags
(thresholds, selection modes, caption rules) -> its record -> the files a run leaves (the run file and its
manifest and summary, the errors file, sidecars, tag folders); :mod:`~serve.outputs.stage` ties them together.
"""
