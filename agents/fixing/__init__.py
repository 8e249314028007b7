"""The fixing stage (nodes: patcher, debugger): the codemod table, one fix = one commit, LLM edits and
their checks, failure diagnosis, and fixes earlier ports learned."""
