// Package userimages builds the OCI images users start from, out of
// Debian packages (package debimage), and puts them in a registry:
// kairon/python:3.11 for now. kairon-local makes sure its registry holds
// them; hack/images builds them for benchmarks and for other registries.
//
// The files:
//
//   - images.go: an image users start from, its cache key, and building it
//     once into a cache shared by every caller on the machine;
//   - python.go, python.lock: kairon/python:3.11 and its Debian packages;
//   - ensure.go: making sure a registry holds an image, pushing it only
//     when the registry lacks this very build.
//
// A built image is cached under CacheDir (by default
// ~/.cache/kairon/images) as an OCI image layout named by its key, a hash
// of its lock file and recipe, so a second build is a directory read.
// See docs/guides/images.md.
package userimages
