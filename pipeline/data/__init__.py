"""Stage 1, data: reading, cleaning and tokenizing the corpus with Ray Data."""
