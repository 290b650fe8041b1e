// Package imagepull is the node agent's side of a Machine's OCI image
// (spec.image with a registry): it starts at most one background pull per
// reference, remembers how each ended, and answers, without blocking,
// whether a Machine's image is on the node yet. The node's Machine
// reconciler asks it before it boots, restores or receives a VM; the image
// store underneath (internal/images) pulls, converts and caches.
//
//   - puller.go: the background pulls and their outcomes;
//   - reference.go: pinning a reference to the digest a Machine runs.
package imagepull
