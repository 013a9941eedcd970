"""Pure functions over Profiles: op tables, folding and pruning."""
