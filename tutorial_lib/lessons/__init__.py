"""The lessons: one module per notebook that measures, built on the loop (tutorial_lib.engine and its parts).

The loop never imports a lesson. Notebooks reach these modules by their short names (`tl.bench`, `tl.ladder`,
`tl.scaling`, ...); a GPU study runs as `python -m tutorial_lib study NAME` (see `studies`).
"""
