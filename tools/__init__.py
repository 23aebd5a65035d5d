"""Generic development tools that import nothing from the app (each could be published on its own)."""
