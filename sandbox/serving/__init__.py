"""The deployment check's sandboxed sides (docs/deploy.md): ``export`` writes the servable folder (with
``layouts``: the decoder weight layouts a vLLM class loads, and ``tokenizer``: the stand-in tokenizer as
tokenizer.json); ``reference`` runs Transformers for the token gate's reference and the side-by-side
throughput; ``client`` starts serve.sh and drives its OpenAI API; ``images`` builds the image request of a
vision-language model.

May import: ``sandbox.harness``, ``sandbox.inputs``, ``sandbox.isolation``, ``knowledge``.
"""
