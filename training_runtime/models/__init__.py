"""Models: the built-in architectures, their torch-free names, and building one for the data at hand."""
