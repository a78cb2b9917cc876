"""The contract: framing, canonical JSON and digests, reducer, state, planner, errors."""
