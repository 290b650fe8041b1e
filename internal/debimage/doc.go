// Package debimage builds OCI images out of Debian packages without a
// container daemon: the packages of a locked closure are fetched with
// apt-get download (which checks them against the archive's signed
// Release file), unpacked with dpkg-deb without running their maintainer
// scripts, and laid out as reproducible layer tars. hack/images builds the
// kairon-node image with it, and package userimages the images users start
// from (kairon/python).
//
// The files:
//
//   - lock.go: a package=version list, resolved by apt and kept in a lock
//     file so that a build takes exactly those packages;
//   - fetch.go: downloading the locked packages into a cache;
//   - tree.go: a layer's file tree, written as a sorted tar;
//   - unpack.go: the packages' files into a tree, with the dpkg database
//     that says what is installed;
//   - base.go, users.go, cacerts.go, alternatives.go: what the maintainer
//     scripts that unpacking skips would have done and an image needs
//     (files copied from their packaged defaults, base-files' directories,
//     accounts, the CA bundle, update-alternatives' links);
//   - ldconfig.go, pycompile.go: the same for what needs one of the
//     image's own programs to run (ldconfig's cache, byte-compiled Python
//     modules), run from a copy of the tree;
//   - image.go: layers and a config put together as an OCI image.
//
// Reproducible: every entry of a layer is dated one given time, entries are
// sorted with numeric owners, and nothing of the build host (user names,
// times, paths) reaches the image, so one lock gives the same bytes twice.
package debimage
