"""The soak: several pipelines retrain over and over on a real daemon and webserver while faults
of every class in RELIABILITY.md arrive at random (a recorded seed), and invariants are checked
as it runs and at the end. ``soak.py`` runs it; docs/reliability.md ("The soak") says how."""
