"""The reading stage (node: agents/nodes/code_reader.py): the hazard scan over the rule registry, how to
run the model (its entry), and the knowledge base's citations for what was found."""
