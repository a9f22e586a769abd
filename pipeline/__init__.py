"""Ray-native SimCSE training with between-epoch hard-negative mining, tracked in MLflow."""

__version__ = "0.1.0"
