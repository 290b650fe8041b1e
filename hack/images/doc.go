// Command images builds Kairon's OCI images without a container daemon:
// kairon-controller, kairon-ui and kairon-node, each an OCI image layout in
// a tar file under --out (bin/images), named <registry>/<name>:<version>.
// It is a build tool of this repository, not something Kairon ships, hence
// hack/ rather than cmd/ (docs/guides/helm.md#images).
//
//	go run ./hack/images [flags]              build (make images)
//	go run ./hack/images push --registry R    push what was built (make push)
//	go run ./hack/images python [--push R]    build kairon/python:3.11 (cached) and
//	                                          make sure registry R holds it
//
// The files:
//
//   - main.go: the flags, the images and their layers, and push;
//   - node_packages.go: the node image's Debian packages (debian.lock);
//   - python.go: the python subcommand, which builds kairon/python
//     (package userimages) and pushes it to a registry.
//
// Resolving, fetching and unpacking Debian packages, and writing layers,
// is package internal/debimage's.
//
// The images are reproducible: every file is dated SOURCE_DATE_EPOCH (by
// default the last commit's time), layer entries are sorted with numeric
// owners, and the Go binaries are built with -trimpath and no build ID, so
// two builds of one checkout give the same bytes.
package main
