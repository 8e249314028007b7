"""The report stage (node: agents/nodes/reporter.py): the bundle and report.md, one function per section,
and every file:line mapped back to the user's original files."""
