"""Data sources: databases, MNIST, the data transformer, device caches."""
