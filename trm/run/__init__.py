"""What train, launch and study share about one run: its directory, its markers and its hosts."""
