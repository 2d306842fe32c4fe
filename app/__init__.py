"""The Textual chat application (UI only)."""
