"""The checkout's deployment scripts (the local stack, the fleet, the container image, the Kubernetes
manifests and the generated docs), importable as `deploy.<script>` from the checkout's root, as the
tests and the bench do; each also runs as `python deploy/<script>.py`. Not part of the installed
package: these drive Prometheus, Alertmanager and podman around it."""
