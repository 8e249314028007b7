"""The one door to the LLM: ``client.LLMClient`` (ask, budget, records) and one module per agent role in
``roles/`` (prompt, answer schema, check); ``assist`` is where the planner, code reader and tuner ask,
``tools`` what the model may call, ``fence`` how untrusted text is marked as data, ``doctor`` the endpoint check."""
