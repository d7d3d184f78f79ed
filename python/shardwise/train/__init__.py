"""The training command (``shardwise-train``): YAML configs with dotted overrides, the bundled
GPT on a bundled corpus, checkpoints that reshard, metrics, and a memory planner
(``shardwise-plan``)."""
