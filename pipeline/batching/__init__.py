"""Batch plans: which rows train together, and the samplers that make them."""
