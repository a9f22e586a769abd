"""What the job drivers need and the stages never do: the command line, the Ray cluster, preflight checks."""
