"""Stage 3, mining: re-encoding, the k-NN index, negative filters, the miner actor."""
