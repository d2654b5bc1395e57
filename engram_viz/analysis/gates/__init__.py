"""Gate analyses: summaries per category and stream selectivity, two prompts compared, gate versus memory,
the hash restart at an image boundary."""
