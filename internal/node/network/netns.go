package network

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNamespace runs fn on a thread in network namespace netns (empty: the
// caller's), so that sockets fn makes belong to that namespace. The thread
// is never unlocked: Go discards it afterwards instead of reusing it in
// the wrong namespace.
func InNamespace(netns string, fn func() error) error {
	if netns == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/var/run/netns/" + netns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", netns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
