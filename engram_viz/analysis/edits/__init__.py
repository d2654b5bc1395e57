"""Editing a memory: what to edit, the row lens, the rows an edit shares with other n-grams, knowledge localisation."""
