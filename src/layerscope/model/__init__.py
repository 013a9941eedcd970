"""The data model: Profile, ModuleNode, Metrics, OpStats, and their saved form."""
