"""Text vocabularies: the embedded CTC head's character set."""
