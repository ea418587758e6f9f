"""The Helmhive runner program: registers a Runner, keeps its Lease, reports, and drives an agent adapter."""
