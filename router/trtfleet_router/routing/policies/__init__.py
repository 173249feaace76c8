"""Routing policies, one module each; the registry is ``routing.framework.registry``."""
