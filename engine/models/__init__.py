"""Models built locally (no hub): a tiny Qwen2 and its tokenizer for tests and the quickstart."""
