"""Files every stage reads or writes: atomic writes (:mod:`~models.files.atomic_writes`), SHA-256 digests
(:mod:`~models.files.digest`), which files are images (:mod:`~models.files.image_extensions`), the one folder walk
and its rule (:mod:`~models.files.folder_walk`) and the layout of a run folder (:mod:`~models.files.run_folder`).

Standard library only (torch is never imported here), so command lines and drivers use them freely.
"""
