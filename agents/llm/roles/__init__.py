"""One module per agent role that asks the LLM: each holds its role (prompt name, answer schema,
whether it may read the model), the question it asks, and the check its answer must pass, the way a
hazard rule holds its detector and its fix. ``agents.llm.client.LLMClient`` is the one door they use."""
