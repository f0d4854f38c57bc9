"""Agent training: multi-turn episodes (episodes.py) and the built-in agent task; sandboxes are trainer/sandbox/."""
