"""Prompt lookup: copy continuations of the last n-gram from the prompt and the text so far (no model)."""
