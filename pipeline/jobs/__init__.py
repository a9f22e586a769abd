"""The jobs a user runs: ``train``, ``mine`` and ``evaluate``, each a ``main(argv)`` behind
``raysimcse <job>`` and ``python jobs/<job>.py``."""
