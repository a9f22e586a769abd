"""Evaluation: STS files, scoring, diagnostics and post-hoc whitening."""
