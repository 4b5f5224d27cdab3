"""A team's own package, copied into a temporary folder outside the repository by the user-path
matrix (tests/user_paths/matrix.py), where it is the package ``cellar``: its definitions, its
training function and its task. Only ``task.py`` is imported from here, by the docs tests (it is
the "Your own Task" example of docs/own-training-code.md); the others name ``cellar`` and load
only from the copy."""
