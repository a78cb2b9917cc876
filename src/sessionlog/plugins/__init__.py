"""pluggy glue: the hook specifications, the plugin manager and the backend registry."""
