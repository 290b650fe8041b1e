package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/zyvor/kairon/internal/debimage"
)

// nodeRoots are the packages the node agent runs: QEMU; ip, bridge and
// nft; sh (dash), through which it writes sysctls in a network namespace
// (ip netns exec NS sh -c ...); and sqfstar (squashfs-tools), which turns
// a Machine's OCI image into the filesystem its guest boots. The node image holds them and
// everything they depend on (no recommends), at the versions of the lock
// file (--lock, debian.lock).
var nodeRoots = []string{"qemu-system-x86", "iproute2", "nftables", "dash", "squashfs-tools"}

const nodeLockHeader = `The Debian packages of the kairon-node image: the closure of %s
without recommends, one package=version a line. hack/images builds from
exactly these; regenerate with: go run ./hack/images --update-lock
`

// nodePackages are the node image's packages: the lock file's, or with
// --update-lock the archive's current closure, written to the lock file.
func nodePackages(o options) ([]debimage.Package, error) {
	if !o.updateLock {
		l, err := debimage.ReadLock(o.lock)
		if err != nil {
			return nil, fmt.Errorf("%w (make one with --update-lock)", err)
		}
		return l.Packages, nil
	}
	pkgs, err := debimage.Resolve(nodeRoots)
	if err != nil {
		return nil, err
	}
	l := debimage.Lock{Packages: pkgs}
	if err := os.WriteFile(o.lock, l.Format(fmt.Sprintf(nodeLockHeader, strings.Join(nodeRoots, ", "))), 0o644); err != nil {
		return nil, err
	}
	return pkgs, nil
}
