"""The error for a whole source or file that cannot be read (one bad row is a failed `Row` instead)."""


class SourceError(ValueError):
    """A whole source or file cannot be read as asked; the message says which and what to do."""
