"""Step 4 of the tagging pipeline, and what the demo and the predictor share of it: an image's scores -> its tags ->
its record -> the files a run leaves.

- choosing tags: :mod:`~serve.outputs.thresholds` (per-class thresholds), :mod:`~serve.outputs.selection_modes`
  (thresholds, MCut, top-k, with a cap and a floor), :mod:`~serve.outputs.caption_rules` (how the chosen classes
  are written);
- :mod:`~serve.outputs.records` (one record per image; the run file, JSONL or CSV; the errors file);
- :mod:`~serve.outputs.stage` (:class:`~serve.outputs.stage.TagSelector` and the writers a run gives each batch);
- the files: :mod:`~serve.outputs.run_manifest`, :mod:`~serve.outputs.run_summary`, :mod:`~serve.outputs.sidecars`
  (with :mod:`~serve.outputs.sidecar_formats`), :mod:`~serve.outputs.tag_folders`.
"""
