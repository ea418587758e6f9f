"""A kind cluster of Helmhive's own, built offline: engine, images, node image, cluster, NetworkPolicy.

Everything a cluster needs is built from the Go module proxy and Debian's packages and cached by
version and inputs (``~/.cache/helmhive`` for binaries, the Docker engine for images), so a warm
``helmhive dev kind up`` only creates the cluster. May import the rest of ``helmhive.devcluster``;
nothing outside ``helmhive.devcluster`` and the CLI imports it.
"""
