"""One router per resource: health, ports (jobs), chat (OpenAI-compatible), web (the page)."""
