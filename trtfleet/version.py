"""trtfleet's version, the single source for the package, the CLI and image tags."""

__version__ = "0.1.0"
