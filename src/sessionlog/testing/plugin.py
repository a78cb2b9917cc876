"""pytest plugin (entry point `pytest11`): fixtures of the sessionlog conformance suite."""
