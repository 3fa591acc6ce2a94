"""Small applications built on the framework and served by CLI commands (not part of pycaffe's API).

``digits``: classify digit images with a LeNet deploy net (``pycaffe-lite classify``, the MNIST demo).
"""
