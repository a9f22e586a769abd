"""Evaluation: STS files, scoring, diagnostics and whitening."""
