"""Test helpers for layers: the gradient checker and CPU/GPU agreement."""
