"""The invariant suite every backend must pass, importable by third-party backends."""
