"""Pure builders of install manifests (RBAC, admission policy). No I/O."""
