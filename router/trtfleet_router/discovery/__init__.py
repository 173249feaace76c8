"""Discovery: where the base models, adapters and serving pods come from (static file/flags or Kubernetes)."""
