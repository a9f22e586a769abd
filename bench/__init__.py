"""Benchmarks: this project's jobs and stages measured, most of them beside the peer tool
(sentence-transformers) on the same data, model and machine, and the recipes' peer runs.

Each benchmark is a module run from the repository root as ``python -m bench.<name>`` (``--help``
lists its flags); with ``--append FILE`` it adds its table to ``docs/benchmarks.md``'s section for
that benchmark. :mod:`bench.common` holds what they share (paths, the model and its label, the
report, the jobs' environment, the timers), :mod:`bench.running_job` a training job watched from
outside (the fault tests use it too). Not installed with the ``pipeline`` package.
"""
