package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// An image guest's identity files: /etc/hostname, /etc/hosts and
// /etc/resolv.conf in the image's root, written when the root is prepared
// (the kernel command line's name, address and nameserver) and again by a
// configure request (a clone's own). They are Kairon's, as Docker's are
// the container runtime's: each replaces whatever the image had, a
// symlink included (resolv.conf often is one, into a /run the image
// expected a resolver daemon to fill), never writing through it.

// GuestIdentity is what the identity files say.
type GuestIdentity struct {
	// Hostname is the guest's name; empty leaves hostname and hosts alone.
	Hostname string
	// Address is the guest's own address, which hosts gives the hostname;
	// the zero Addr gives it 127.0.1.1 (as Debian does without one).
	Address netip.Addr
	// DNS are the nameservers of resolv.conf; none leaves it alone.
	DNS []string
}

// hostsFile is /etc/hosts for id.
func hostsFile(id GuestIdentity) string {
	addr := "127.0.1.1"
	if id.Address.IsValid() {
		addr = id.Address.Unmap().String()
	}
	return "127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		addr + "\t" + id.Hostname + "\n"
}

// resolvConf is /etc/resolv.conf naming dns.
func resolvConf(dns []string) string {
	var sb strings.Builder
	for _, d := range dns {
		sb.WriteString("nameserver " + d + "\n")
	}
	return sb.String()
}

// WriteIdentity writes id's files into the image's /etc (made if the
// image has none).
func WriteIdentity(root string, id GuestIdentity) error {
	if id.Hostname == "" && len(id.DNS) == 0 {
		return nil
	}
	etc, err := openEtc(root)
	if err != nil {
		return err
	}
	defer etc.Close()
	var files [][2]string
	if id.Hostname != "" {
		files = append(files, [2]string{"hostname", id.Hostname + "\n"}, [2]string{"hosts", hostsFile(id)})
	}
	if len(id.DNS) > 0 {
		files = append(files, [2]string{"resolv.conf", resolvConf(id.DNS)})
	}
	var errs []error
	for _, f := range files {
		content := f[1]
		err := replaceAt(int(etc.Fd()), "/etc/"+f[0], f[0], 0o644, func(w *os.File) error {
			_, err := w.WriteString(content)
			return err
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// openEtc opens the image's /etc, following a symlink there inside the
// root; a missing one (or a symlink to nothing) is made a directory.
func openEtc(root string) (*os.File, error) {
	f, err := openInRoot(root, "/etc", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return f, err
	}
	if err := ensureDirAt(root, "etc", 0o755); err != nil {
		return nil, err
	}
	return openInRoot(root, "/etc", unix.O_PATH|unix.O_DIRECTORY, 0)
}

// ensureDirAt makes name, an entry of root itself, a directory: anything
// else there (a symlink, a file) is removed first. Only for the entries
// Kairon owns in an image (mount points, a missing /etc).
func ensureDirAt(root, name string, mode uint32) error {
	rfd, err := openRootDir(root)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	var st unix.Stat_t
	err = unix.Fstatat(rfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil
	case err == nil:
		if err := unix.Unlinkat(rfd, name, 0); err != nil {
			return &os.PathError{Op: "remove", Path: "/" + name, Err: err}
		}
	case err != unix.ENOENT:
		return &os.PathError{Op: "stat", Path: "/" + name, Err: err}
	}
	if err := unix.Mkdirat(rfd, name, mode); err != nil {
		return &os.PathError{Op: "mkdir", Path: "/" + name, Err: err}
	}
	// Mkdirat's mode passes through the umask.
	if err := unix.Fchmodat(rfd, name, mode, 0); err != nil {
		return fmt.Errorf("chmod /%s: %w", name, err)
	}
	return nil
}
