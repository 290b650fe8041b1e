// Package images is a node's image store: it turns an OCI image reference
// (a Machine's spec.image) into one read-only squashfs file laid out as
// internal/imagefs says, which the guest boots. It pulls with
// go-containerregistry, verifies every digest, flattens the layers
// without extracting them anywhere (a sanitised tar stream piped into
// sqfstar), and caches the result by digest for every VM of the node.
// docs/design/image-format.md says why squashfs and lz4.
//
//   - store.go: Options, NewStore (and the crash recovery of the cache
//     directory), Resolve, Ensure, Lookup, Image;
//   - pull.go: one image's pull: size limit, config, layers downloaded in
//     parallel, conversion, the file renamed into place;
//   - resolver.go: Resolver, a reference's digest by the store's rules
//     and without a cache (kairon-controller pins pools' images with it);
//   - remote.go: the registry side: references, manifests and indexes, the
//     linux/amd64 pick, verified blob downloads, the HTTP transport that
//     keeps plain HTTP to loopback and the insecure registries;
//   - keychain.go: KeychainFromDockerConfigs, pull secrets as kubelet
//     reads them;
//   - layer.go: a layer's tar stream (gzip, zstd or none), its diff ID,
//     and the decompression budget;
//   - sanitize.go: one tar header checked and normalised (paths, types,
//     owners, modes, extended attributes, whiteouts);
//   - tree.go: the layers applied one over the other, headers only
//     (whiteouts, opaque directories, hard links, symbolic links followed
//     inside the image);
//   - flatten.go: the layers' headers read (two layers at a time) and
//     applied into the tree, then the tree and the layers' content written
//     as one tar stream;
//   - squashfs.go: sqfstar, which makes the squashfs from that stream;
//   - index.go: the cache's index.json and its atomic writes;
//   - gc.go: GC, least recently used first, under the disk budget;
//   - flight.go: one pull per image however many callers ask;
//   - errors.go: PullError and its reasons, and how a registry's errors
//     map to them;
//   - metrics.go: the Metrics the node agent implements;
//   - units.go: sizes in messages.
//
// The tests pull from a real registry on loopback
// (internal/testenv.StartRegistry); testdata/measure-formats.sh measures
// the filesystem formats the design doc compares.
package images
