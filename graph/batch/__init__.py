"""Batch mode: many ports from one manifest, each the ordinary single-port graph run with its own
workspace, sandbox and bundle; state in SQLite under the npuport home so a batch resumes after a
crash; ports run as Ray tasks (embedded local Ray or a cluster) or as local subprocesses."""
