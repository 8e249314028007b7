"""The inputs a run feeds the model, built the way the model's own code builds them: an inputs hook, the
model's own preprocessing path (``model_inputs``, the generate call it makes caught by
``generate_capture``), the folder's processor (``processor_inputs``), a stand-in tokenizer when the
release ships none (``stand_in_tokenizer``), or inputs synthesised from the run method's signature (a tower's
pixels, audio features or waveform, and a processor's missing audio part: ``tower_inputs``); and
the forward outputs an encoder is validated on (``run_outputs``). ``inputs_base`` holds what they share.

These modules ship in every bundle beside run.py (agents/deploy/runscript.py), so they import nothing of
npuport: the standard library, torch and transformers only, and each other by relative import. This
``__init__`` imports nothing.
"""
