"""The mutation registry of models/mutants.py: the catalogue (one file per
subsystem), the runner, and the record with the keys CI selects by."""
