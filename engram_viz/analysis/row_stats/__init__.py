"""Which table rows are read and shared: row usage, hash collisions, a Trace's n-grams and their collision
exposure, the inverse index row -> n-grams."""
