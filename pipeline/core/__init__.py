"""What every layer may use: one-line errors, retries, test seams. Imports nothing from pipeline."""
