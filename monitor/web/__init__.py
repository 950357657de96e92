"""The HTTP face: the app, its routes, auth, guards, /metrics exposition, settings and the CLI."""
