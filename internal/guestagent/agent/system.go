package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// System applies configure requests to the guest itself: hostname, the
// interface's hardware address, addresses and default route (through
// rtnetlink), DNS servers and the kernel's entropy pool.
type System struct {
	// Interface is the network interface configured; empty: eth0.
	Interface string
	// Root, in an image guest, is the image's root, whose identity files
	// (identity.go) follow the new hostname, address and DNS servers.
	Root string
}

// Configure implements Options.Configure. It applies every part it can and
// reports every part that failed.
func (sys System) Configure(c *wire.Configure) error {
	ifname := sys.Interface
	if ifname == "" {
		ifname = "eth0"
	}
	var errs []error
	if c.Hostname != "" {
		if err := unix.Sethostname([]byte(c.Hostname)); err != nil {
			errs = append(errs, fmt.Errorf("hostname: %w", err))
		} else {
			_ = os.WriteFile("/etc/hostname", []byte(c.Hostname+"\n"), 0o644)
		}
	}
	if c.MAC != "" || len(c.Addresses) > 0 || c.Gateway != "" {
		if err := configureLink(ifname, c); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.DNS) > 0 {
		var sb strings.Builder
		for _, d := range c.DNS {
			sb.WriteString("nameserver " + d + "\n")
		}
		if err := os.WriteFile("/etc/resolv.conf", []byte(sb.String()), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("dns: %w", err))
		}
	}
	if len(c.Seed) > 0 {
		if err := addEntropy(c.Seed); err != nil {
			errs = append(errs, fmt.Errorf("seed: %w", err))
		}
	}
	if sys.Root != "" {
		if err := WriteIdentity(sys.Root, imageIdentity(c)); err != nil {
			errs = append(errs, fmt.Errorf("the image's identity files: %w", err))
		}
	}
	return errors.Join(errs...)
}

// imageIdentity is what an image's identity files say after c: its
// hostname (the guest's current one if c names none but a new address,
// which /etc/hosts gives it), its first address, its DNS servers.
func imageIdentity(c *wire.Configure) GuestIdentity {
	id := GuestIdentity{Hostname: c.Hostname, DNS: c.DNS}
	if len(c.Addresses) > 0 {
		if p, err := netip.ParsePrefix(c.Addresses[0]); err == nil {
			id.Address = p.Addr()
		}
		if id.Hostname == "" {
			id.Hostname, _ = os.Hostname()
		}
	}
	return id
}

// configureLink gives ifname c's hardware address, addresses and default
// route. A default route is not tried once the addresses failed: it could
// only fail too, and hide the cause.
func configureLink(ifname string, c *wire.Configure) error {
	l, err := openLink(ifname)
	if err != nil {
		return err
	}
	defer l.Close()
	var errs []error
	if c.MAC != "" {
		if err := setMAC(l, c.MAC); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Addresses) > 0 {
		if err := setAddresses(l, c.Addresses); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	if c.Gateway != "" {
		gw, err := netip.ParseAddr(c.Gateway)
		if err == nil {
			err = l.replaceDefaultRoute(gw)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway: %w", err))
		}
	}
	return errors.Join(errs...)
}

func setMAC(l *link, s string) error {
	mac, err := net.ParseMAC(s)
	if err != nil {
		return fmt.Errorf("mac: %w", err)
	}
	return l.setMAC(mac)
}

// setAddresses replaces the interface's addresses with addrs and sets it
// up.
func setAddresses(l *link, addrs []string) error {
	prefixes := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		var err error
		if prefixes[i], err = netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("addresses[%d]: %w", i, err)
		}
	}
	if err := l.flushAddresses(); err != nil {
		return err
	}
	for _, p := range prefixes {
		if err := l.addAddress(p); err != nil {
			return err
		}
	}
	return l.up()
}

// addEntropy mixes seed into the kernel's pool and credits it
// (RNDADDENTROPY), so a guest restored from a shared snapshot draws its own
// random numbers from then on.
func addEntropy(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	req := make([]byte, 8+len(seed))
	*(*int32)(unsafe.Pointer(&req[0])) = int32(8 * len(seed))
	*(*int32)(unsafe.Pointer(&req[4])) = int32(len(seed))
	copy(req[8:], seed)
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&req[0])))
		if errno != 0 {
			ierr = errno
		}
	}); err != nil {
		return err
	}
	if ierr != nil {
		// Without the privilege to credit it, still mix it in.
		_, err := f.Write(seed)
		return err
	}
	return nil
}
