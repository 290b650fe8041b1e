package agent

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// System applies configure requests to the guest itself: hostname, the
// interface's addresses and default route (with the guest's `ip`), DNS
// servers and the kernel's entropy pool.
type System struct {
	// Interface is the network interface configured; empty: eth0.
	Interface string
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
	if c.MAC != "" {
		// virtio-net changes it live (and tells the device, so the device
		// filters on the new one).
		if err := ip("link", "set", "dev", ifname, "address", c.MAC); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Addresses) > 0 {
		err := flushAddresses(ifname)
		for _, a := range c.Addresses {
			if err != nil {
				break
			}
			err = ip("addr", "add", a, "dev", ifname)
		}
		if err == nil {
			err = ip("link", "set", ifname, "up")
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.Gateway != "" {
		if err := ip("route", "replace", "default", "via", c.Gateway, "dev", ifname); err != nil {
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
	return errors.Join(errs...)
}

// flushAddresses removes every address of ifname. busybox's flush lists
// the addresses, then deletes them in one batch; deleting a primary IPv4
// address takes the secondaries of its subnet with it, so their deletes in
// that batch fail ("Cannot assign requested address") though nothing is
// left. The next flush lists what really is left.
func flushAddresses(ifname string) error {
	var err error
	for range 3 {
		if err = ip("addr", "flush", "dev", ifname); err == nil {
			return nil
		}
	}
	return err
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
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
