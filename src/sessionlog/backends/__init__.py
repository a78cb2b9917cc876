"""Built-in backends: one module each, on the shared JSONL writer core (`jsonl_file`)."""
