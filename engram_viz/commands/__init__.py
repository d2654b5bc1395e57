"""What each ``engram-viz`` sub-command does with its parsed arguments and prints: one module per
group of sub-commands, each imported by ``engram_viz.cli`` only when one of its commands runs (so
the corpus command never loads torch and ``--help`` loads nothing of the library)."""
